"""The cause patterns: one record each, and the registry that holds them.

A pattern names how an image left its format (from ops, shapes, strides and data flow, never
from names of models or modules): what happened, the one-line remedy the docs' table gives,
the fix text a cause carries, and what the timing model puts in place of the cause's own ops.
Adding a pattern is one :func:`register_pattern` call here, the tracer's rule that emits it
(:meth:`auditor._analysis._causes.CauseTracer.pattern`) and one
generator declared in :mod:`auditor._fix._variants` and registered with
:func:`auditor._fix._registry.register_fix` in its family's module; ``tests/test_causes.py`` checks that every pattern the tracer can emit is
complete, and the docs' pattern table
is generated from this registry (``docs/hooks.py``). The registry is internal: detection is
the tracer's code, so a pattern registered from outside would never be emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What a fix puts in place of a cause's own ops (:attr:`Pattern.replaces`): one pass that writes
#: the result in the format (a pool and its backward for a mean over H and W and its backward, a
#: broadcast copy for an upsampled N×C×1×1 map, a sum of the branches for a stack and its
#: reduction, split's backward for a slice's) ...
WRITE = "write"
#: ... or the op stays and a copy into the format follows it.
COPY_AFTER = "copy_after"


@dataclass(frozen=True)
class Pattern:
    """One way an image leaves its format."""

    name: str
    happened: str  #: what happened, as the docs' table says it
    remedy: str  #: the one-line fix, as the docs' table says it
    fix: str  #: the fix text of a cause, with ``{cl}``, ``{fmt}``, ``{op}``, ``{dims}``, ``{support}``,
    #: ``{to_memory_order}`` and ``{from_memory_order}`` filled in by the tracer
    replaces: str | None = None  #: :data:`WRITE`, :data:`COPY_AFTER`, or None: its ops stay, less
    #: the format copies inside them

    def fix_text(self, **fields) -> str:
        return self.fix.format(**fields)


#: name -> pattern, in the order they were registered
PATTERNS: dict[str, Pattern] = {}


def register_pattern(name: str, *, happened: str, remedy: str, fix: str, replaces: str | None = None) -> Pattern:
    """Add a pattern to the registry; a name can be registered once."""
    if name in PATTERNS:
        raise ValueError(f"pattern {name!r} is registered already")
    if replaces not in (None, WRITE, COPY_AFTER):
        raise ValueError(f"replaces is {WRITE!r}, {COPY_AFTER!r} or None, got {replaces!r}")
    PATTERNS[name] = found = Pattern(name, happened, remedy, fix, replaces)
    return found


def pattern(name: str) -> Pattern:
    """The registered pattern ``name``; an unknown name raises ``KeyError`` naming the known ones."""
    try:
        return PATTERNS[name]
    except KeyError:
        raise KeyError(f"no cause pattern {name!r}; registered: {', '.join(PATTERNS)}") from None


EXPLICIT_COPY = register_pattern(
    "explicit_copy",
    happened="`.contiguous()` or `.to(memory_format=...)` into contiguous",
    remedy="ask for `memory_format=torch.channels_last`, or drop the copy",
    fix="ask for {cl} here (.contiguous(memory_format=torch.{cl})), or drop the copy")
RESHAPE_MERGE = register_pattern(
    "reshape_merge",
    happened="a reshape that merges C with H, W had to copy",
    remedy="reshape the NHWC view, or keep the region contiguous",
    fix="this reshape merges C with other dimensions, which {cl} cannot view: reshape the NHWC view instead "
        "(permute(0, 2, 3, 1) first) or keep this region contiguous")
CHANNEL_SHUFFLE = register_pattern(
    "channel_shuffle",
    happened="`view → transpose → .contiguous()`",
    remedy="`torch.nn.functional.channel_shuffle`",
    fix="use torch.nn.functional.channel_shuffle(x, groups), which keeps {cl}")
STACK_REDUCE = register_pattern(
    "stack_reduce",
    happened="images stacked on a new dimension, reduced over it",
    remedy="combine the branches without stacking (`a + b`)",
    fix="combine the branches without stacking them (a + b, or a weighted sum): the reduction over the stacked "
        "dimension writes contiguous",
    replaces=WRITE)
NC11_BROADCAST = register_pattern(
    "nc11_broadcast",
    happened="an N×C×1×1 map written full size in contiguous order (interpolate)",
    remedy="`.expand(-1, -1, H, W).contiguous(memory_format=torch.channels_last)`",
    fix="broadcast the N×C×1×1 map with .expand(-1, -1, H, W).contiguous(memory_format=torch.{cl}) instead: this "
        "op writes it full size in contiguous order",
    replaces=WRITE)
MEAN_BACKWARD = register_pattern(
    "mean_backward",
    happened="PyTorch's backward of a mean over H, W (expand, then divide) writes contiguous",
    remedy="`F.avg_pool2d(x, x.shape[-2:])` (or `x.sum((2, 3), keepdim=True) / (H * W)`)",
    fix="PyTorch's backward of a mean over H and W writes contiguous: pool with F.avg_pool2d(x, x.shape[-2:]) (or "
        "x.sum((2, 3), keepdim=True) / (H * W)) instead",
    replaces=WRITE)
CHANNEL_SLICE = register_pattern(
    "channel_slice",
    happened="the backward of a channel slice writes contiguous zeros",
    remedy="`torch.split` / `torch.chunk`",
    fix="split the channels with torch.split or torch.chunk instead of slicing them: the backward of a slice "
        "writes contiguous zeros",
    replaces=WRITE)
INPLACE_VIEW = register_pattern(
    "inplace_view",
    happened="an in-place op on a view: autograd copies its gradient into contiguous order",
    remedy="`y = y + z`",
    fix="write `y = y + ...` instead of an in-place op on a view: autograd copies the gradient of a view written "
        "in place into contiguous order")
WEIGHT_REBUILT = register_pattern(
    "weight_rebuilt",
    happened="a weight rebuilt in another format every step (a reshape of a channels_last parameter)",
    remedy="flatten the parameter in its memory order (`w.permute(0, 2, 3, 1)`, which the reshape views) and "
           "permute the result back: the same ops, no copy",
    fix="the weight is rebuilt in {fmt} order every step and the convolution permutes it: flatten the {cl} "
        "parameter in its memory order (w.permute{to_memory_order}, which the reshape then views) and permute the "
        "result back (.permute{from_memory_order}); statistics over the flattened dims do not depend on their order")
WEIGHT_FORMAT = register_pattern(
    "weight_format",
    happened="a parameter stored in another format than its convolution computes in",
    remedy="`convert_conv2d_weight_memory_format`",
    fix="store this convolution's weight in {cl} (auditor.convert_conv{dims}d_weight_memory_format)")
MIXED_JOIN = register_pattern(
    "mixed_join",
    happened="`cat` of channels_last maps and a tensor in another format: it writes that format",
    remedy="convert the odd tensor to the others' format before the join",
    fix="{op} joins {cl} maps with a tensor in {fmt} order, so it writes {fmt}: convert that tensor to the format "
        "of the others before the join (.contiguous(memory_format=...)); it is usually the small one")
CONV_NO_KERNEL = register_pattern(
    "conv_no_kernel",
    happened="a convolution with no channels_last kernel for this shape, dtype and device",
    remedy="run it (and what it feeds) contiguous",
    fix="this convolution has no {cl} kernel for this shape on this device (coverage: {support}): run it, and what "
        "it feeds, contiguous")
NO_CL_KERNEL = register_pattern(
    "no_cl_kernel",
    happened="an op with no channels_last kernel here, as `coverage()` shows",
    remedy="a format-keeping version, or keep the region contiguous",
    fix="{op} has no {cl} kernel on this device (coverage: {support}): use a format-keeping version, or keep this "
        "region contiguous")
LOSES = register_pattern(
    "loses",
    happened="any other loss",
    remedy="make the result channels_last where it is made",
    fix="{op} wrote {fmt} from a {cl} input here: make its result {cl} (.contiguous(memory_format=torch.{cl}))",
    replaces=COPY_AFTER)
JOINS = register_pattern(
    "joins",
    happened="data joining the path off its format",
    remedy="make it channels_last where it is made",
    fix="this tensor joins the {cl} path in {fmt} order: make it {cl} where it is created (compute it on the image, "
        "or a 4-D view of it, rather than on a reshaped copy)")
