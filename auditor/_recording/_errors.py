"""The errors a compiled audit raises, apart from the Inductor-reading modules that raise them,
so that naming them (``auditor.CompileError``) imports nothing of Inductor."""


class CompileError(RuntimeError):
    """``torch.compile`` could not compile the model: Dynamo's or Inductor's reason, first line."""
