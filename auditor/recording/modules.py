"""Module attribution: which module is running, and what its ops are called in the log.

Forward ops take the innermost running module from torch's ``ModuleTracker`` hooks; backward
ops take the module of the forward op that created their autograd node (the recorder's job,
see :mod:`auditor.recording.mode`). Names follow torch's own rule and are turned into the
``named_modules`` names users know by :func:`module_names`, once, when the log is built.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch.utils.module_tracker import ModuleTracker

#: Module column for ops outside every module, and for the root module's own ops.
GLOBAL_MODULE = "<global>"
ROOT_MODULE = "<root>"
#: The label of ops outside every module and of nodes the recorder did not see created.
GLOBAL_LABEL = ("Global", "")

#: Wrappers whose ``module`` child is the user's model: their names are dropped from fqns.
_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"})


class ForwardModuleTracker(ModuleTracker):
    """torch's ModuleTracker for the forward pass (its module names, its global forward hooks),
    with the innermost running module's (name, "") kept in ``label`` for the recorder to read
    per op.

    Its backward mechanism is not used: two multi-grad hooks per module call were most of the
    cost of recording, and they can only guess which module a backward op belongs to. Instead
    the recorder maps each autograd node back to the forward op that created it. Its
    ``parents`` set is not kept up to date either.
    """

    def __init__(self):
        super().__init__()
        self.label = GLOBAL_LABEL  # (innermost module, ""): one shared tuple per module
        self.types: dict[str, str] = {}
        self.param_modules: dict = {}  # id(parameter) -> module name, for AccumulateGrad nodes
        # id(module) -> (module, label). torch's name lookup goes through weak dictionaries,
        # several weakrefs per call; the module is held so that its id stays its own.
        self._labels: dict[int, tuple] = {}
        self._stack: list[tuple[str, str]] = []

    def _name_tree(self, mod, name: str) -> tuple[str, str]:
        """Name ``mod``, and the modules under it, by torch's rule (``_get_mod_name``) in one
        pass over plain dictionaries: a module first seen is named by its type; a module's
        children are named after it when it is first seen (the last path to a shared module
        wins); a module seen before keeps the names it gave its children. Also notes each
        module's type and the module that owns each parameter."""
        first_seen = id(mod) not in self._labels
        label = (name, "")
        self._labels[id(mod)] = (mod, label)
        self.types.setdefault(name, type(mod).__name__)
        if first_seen:
            for p in mod._parameters.values():
                if p is not None:
                    self.param_modules.setdefault(id(p), name)
            for child_name, child in mod.named_children():
                self._name_tree(child, f"{name}.{child_name}")
        return label

    def _fw_pre_hook(self, mod, input):
        seen = self._labels.get(id(mod))
        label = seen[1] if seen is not None else self._name_tree(mod, type(mod).__name__)
        self._stack.append(label)
        self.label = label

    def _fw_post_hook(self, mod, input, output):
        seen = self._labels.get(id(mod))
        label = seen[1] if seen is not None else self._name_tree(mod, type(mod).__name__)
        stack = self._stack
        if stack and stack[-1] is label:
            stack.pop()
        else:  # a hook raised between this module's pre and post hooks: find it further down
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == label[0]:
                    del stack[i]
                    break
        self.label = stack[-1] if stack else GLOBAL_LABEL

    def __exit__(self, *args):
        super().__exit__(*args)
        self.param_modules = {}
        self._labels = {}


def module_names(tracker_names: Iterable[str], types: dict[str, str]):
    """ModuleTracker names ("ResNet.layer1.0") -> (fqn, type) as ``named_modules`` gives them.

    The first top-level module seen is the root: its prefix is dropped and its own ops are
    ``<root>``. Any other top-level module (a loss module, say) keeps its class name as prefix.
    """
    root = None
    mapping = {}
    for name in tracker_names:
        if name in mapping:
            continue
        if name == "Global":
            mapping[name] = (GLOBAL_MODULE, "")
            continue
        head, _, rest = name.partition(".")
        if root is None:
            root = head
        if head == root:
            if types.get(head) in _WRAPPERS and (rest == "module" or rest.startswith("module.")):
                rest = rest[len("module."):]  # DDP(model): name the model's modules, not the wrapper's
            fqn = rest or ROOT_MODULE
        else:
            fqn = name
        mapping[name] = (fqn, types.get(name, head if not rest else ""))
    return mapping
