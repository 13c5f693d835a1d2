"""Module attribution: which module is running, and what its ops are called in the log.

Forward ops take the innermost running module from torch's ``ModuleTracker`` hooks; backward
ops take the module of the forward op that created their autograd node (the recorder's job,
see :mod:`auditor._recording._mode`), except while a module's forward runs again inside backward
(activation checkpointing recomputes it there): then its ops are that module's. Names follow
torch's own rule and are turned into the ``named_modules`` names users know by
:func:`module_names`, once, when the log is built.

Module hooks are global to the process, so each hook first asks whose call it is: the recording
thread's, or an autograd engine thread's working on this recording's backward; any other
thread's module calls are not tracked.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable

from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.module_tracker import ModuleTracker

from ._torch import current_graph_task_id, dispatch_stack_at, len_dispatch_stack

#: Module column for ops outside every module, and for the root module's own ops.
GLOBAL_MODULE = "<global>"
ROOT_MODULE = "<root>"
#: The label of ops outside every module and of nodes the recorder did not see created.
GLOBAL_LABEL = ("Global", "")

#: Wrappers whose child holds the user's model, by type name -> that child's attribute name:
#: their names are dropped from fqns.
_WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "module",
    "OptimizedModule": "_orig_mod",  # torch.compile(model)
}

_get_ident = threading.get_ident
_graph_task_id = current_graph_task_id
_stack_len = len_dispatch_stack
_stack_at = dispatch_stack_at

#: Frames the recursion limit is raised by whenever modules nest deeper than what was added so
#: far: under any module hook, torch calls each module through one more Python frame
#: (``_call_impl``'s ``inner``), and the hooks and the mode add a few at the innermost call.
_DEPTH_STEP = 64


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
        self.thread = _get_ident()  # the recording thread: its module calls are tracked
        self.mode = None  # the recorder's mode: an engine thread whose dispatch stack holds it is ours
        # Modules whose forward runs inside backward (checkpoint recomputation), per thread,
        # and how many are open in all threads: the recorder reads the count per backward op.
        self._backward_stacks: dict[int, list[tuple[str, str]]] = {}
        self.recomputing = 0
        self._room = 0  # module depth from which the recursion limit is raised again
        self._raised = 0  # frames added to the recursion limit, given back on exit

    def _name_tree(self, mod, name: str) -> tuple[str, str]:
        """Name ``mod``, and the modules under it, by torch's rule (``_get_mod_name``) in one
        pass over plain dictionaries: a module first seen is named by its type; a module's
        children are named after it when it is first seen (the last path to a shared module
        wins); a module seen before keeps the names it gave its children. Also notes each
        module's type and the module that owns each parameter. Iterative (in the order torch's
        recursion takes), so a model of any depth can be named."""
        labels, types, params = self._labels, self.types, self.param_modules
        todo = [(mod, name)]
        while todo:
            m, n = todo.pop()
            first_seen = id(m) not in labels
            labels[id(m)] = (m, (n, ""))
            types.setdefault(n, type(m).__name__)
            if first_seen:
                for p in m._parameters.values():
                    if p is not None:
                        params.setdefault(id(p), n)
                children = m._modules  # what named_children() walks, without a generator per module
                if children:
                    seen, kids = set(), []
                    for child_name, child in children.items():
                        if child is not None and child not in seen:  # named_children's rule
                            seen.add(child)
                            kids.append((child, f"{n}.{child_name}"))
                    kids.reverse()
                    todo.extend(kids)
        return labels[id(mod)][1]

    def _label_of(self, mod) -> tuple[str, str]:
        seen = self._labels.get(id(mod))
        return seen[1] if seen is not None else self._name_tree(mod, type(mod).__name__)

    def _fw_pre_hook(self, mod, input):
        if _get_ident() != self.thread or _graph_task_id() != -1:
            self._backward_enter(mod)
            return
        seen = self._labels.get(id(mod))
        label = seen[1] if seen is not None else self._name_tree(mod, type(mod).__name__)
        stack = self._stack
        if len(stack) >= self._room:
            self._deeper()
        stack.append(label)
        self.label = label

    def _fw_post_hook(self, mod, input, output):
        if _get_ident() != self.thread or _graph_task_id() != -1:
            self._backward_exit(mod)
            return
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

    # -- modules run inside backward, and other threads ------------------------------------
    def _ours(self) -> bool:
        """Whether this thread runs backward for this recording: the recording thread, or an
        autograd engine thread, which runs with the dispatch modes of the thread that called
        backward."""
        if _graph_task_id() == -1:
            return False  # another thread's forward
        if _get_ident() == self.thread:
            return True
        mode = self.mode
        return mode is not None and any(_stack_at(i) is mode for i in range(_stack_len()))

    def _backward_enter(self, mod) -> None:
        if not self._ours():
            return
        label = self._label_of(mod)
        stack = self._backward_stacks.setdefault(_get_ident(), [])
        if len(stack) + len(self._stack) >= self._room:
            self._deeper()
        stack.append(label)
        self.recomputing += 1

    def _backward_exit(self, mod) -> None:
        stack = self._backward_stacks.get(_get_ident())
        if not stack:
            return
        label = self._label_of(mod)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is label:
                del stack[i]
                self.recomputing -= 1
                break

    def backward_label(self) -> tuple[str, str] | None:
        """The innermost module whose forward this thread runs inside backward, if any."""
        stack = self._backward_stacks.get(_get_ident())
        return stack[-1] if stack else None

    def _deeper(self) -> None:
        """Raise the recursion limit by what the hooks cost a deeper model: one frame per
        module level, so that a model that runs plainly runs under the recorder."""
        try:
            sys.setrecursionlimit(sys.getrecursionlimit() + _DEPTH_STEP)
        except (RecursionError, ValueError):
            return
        self._raised += _DEPTH_STEP
        self._room += _DEPTH_STEP

    # -- entering and leaving ---------------------------------------------------------------
    def __enter__(self):
        self._fw_pre_handle = self._fw_post_handle = None
        try:
            self._fw_pre_handle = register_module_forward_pre_hook(self._fw_pre_hook)
            # always_call: a forward that raises leaves its module too (non-reentrant checkpointing
            # stops a recomputation by raising once it has what backward needs)
            self._fw_post_handle = register_module_forward_hook(self._fw_post_hook, always_call=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *args):
        """Remove the hooks (whichever were registered) and give back the recursion limit."""
        for name in ("_fw_pre_handle", "_fw_post_handle"):
            handle = getattr(self, name, None)
            setattr(self, name, None)
            if handle is not None:
                handle.remove()
        if self._raised:
            raised, self._raised = self._raised, 0
            try:
                sys.setrecursionlimit(max(sys.getrecursionlimit() - raised, 1))
            except (RecursionError, ValueError):  # deeper now than the limit it had
                pass
        self.param_modules = {}
        self._labels = {}
        self._backward_stacks, self.recomputing = {}, 0
        self.mode = None


def module_names(tracker_names: Iterable[str], types: dict[str, str]):
    """ModuleTracker names ("ResNet.layer1.0") -> (fqn, type) as ``named_modules`` gives them.

    The first top-level module seen is the root: its prefix is dropped and its own ops are
    ``<root>``. Any other top-level module (a loss module, say) keeps its class name as prefix.
    A wrapper root (DDP, ``torch.compile``'s ``OptimizedModule``) is looked through: its
    model's modules are named as the model's own.
    """
    root = None
    mapping = {}
    for name in tracker_names:
        if name in mapping:
            continue
        if name == GLOBAL_LABEL[0]:
            mapping[name] = (GLOBAL_MODULE, "")
            continue
        head, _, rest = name.partition(".")
        if root is None:
            root = head
        if head == root:
            child = _WRAPPERS.get(types.get(head, ""))
            if child is not None and (rest == child or rest.startswith(child + ".")):
                rest = rest[len(child) + 1:]  # DDP(model): name the model's modules, not the wrapper's
            fqn = rest or ROOT_MODULE
        else:
            fqn = name
        mapping[name] = (fqn, types.get(name, head if not rest else ""))
    return mapping
