"""The per-op classification rule: does this op preserve, lose, convert or restore channels_last?

One scalar function, :func:`classify`, decides for one op call from its tensors' labels alone.
The recorder's ``strict=True`` calls it online and the analyzer calls it once per distinct op
signature, so the two can never disagree. Data flow (is the op *between two convolutions*?) is
the analyzer's business, not this module's.
"""

from __future__ import annotations

from typing import NamedTuple

from .formats import (
    CHANNELS_LAST,
    CHANNELS_LAST_3D,
    CONTIGUOUS,
    OTHER,
    base_format,
)

PRESERVES = "preserves"
LOSES = "loses"
CONVERTS = "converts"
RESTORES = "restores"
VIEW = "view"
AMBIGUOUS_KIND = "ambiguous"
NOT_APPLICABLE = "n/a"

#: Every classification, in a stable order (used for categoricals).
KINDS = (PRESERVES, LOSES, CONVERTS, RESTORES, VIEW, AMBIGUOUS_KIND, NOT_APPLICABLE)
#: Classifications that move data into another physical order.
COSTLY_KINDS = (LOSES, CONVERTS, RESTORES)

_CL = (CHANNELS_LAST, CHANNELS_LAST_3D)
_DEFINITE = (CONTIGUOUS, CHANNELS_LAST, CHANNELS_LAST_3D, OTHER)

#: Input arguments that are weights, not activations, whatever their type.
WEIGHT_ARGS = frozenset({"weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd"})

#: Arguments that play the same part in an op (cat's list, a binary op's operands).
_PEER_ARGS = frozenset({"self", "other", "tensors"})

#: Ops that copy their input into a layout somebody chose: a conversion, never a loss.
COPY_OPS = frozenset({"aten.clone", "aten._to_copy", "aten.copy_", "aten.copy", "aten._copy_from"})

#: Ops that allocate without reading data: they cannot lose a format.
_FACTORY_NAMES = frozenset(
    {
        "aten.empty",
        "aten.empty_strided",
        "aten.zeros",
        "aten.ones",
        "aten.full",
        "aten.arange",
        "aten.scalar_tensor",
        "aten.new_empty",
        "aten.new_empty_strided",
        "aten.new_zeros",
        "aten.new_ones",
        "aten.new_full",
        "aten.rand",
        "aten.randn",
        "aten.randint",
    }
)


class TensorSig(NamedTuple):
    """What the rule needs to know about one tensor argument or result."""

    role: str  # "input" or "output"
    position: int  # schema argument index (inputs) or return index (outputs)
    arg: str  # schema argument name ("" for outputs)
    label: str  # formats.format_label
    is_param: bool
    is_view: bool  # output aliases an input without writing it
    nbytes: int
    floating: bool = True  # floating or complex dtype; indices and masks are never activations


class Verdict(NamedTuple):
    kind: str
    nbytes: int
    from_format: str
    to_format: str


def op_packet(op: str) -> str:
    """``aten.clone.default`` -> ``aten.clone``: the op without its overload."""
    head, _, _ = op.rpartition(".")
    return head if head.count(".") >= 1 else op


def is_convolution(op: str) -> bool:
    packet = op_packet(op)
    return "convolution" in packet or packet.startswith(
        ("aten._slow_conv", "aten.slow_conv", "aten.thnn_conv", "aten._conv_depthwise", "aten.conv_depthwise")
    )


def is_factory(op: str) -> bool:
    packet = op_packet(op)
    return packet in _FACTORY_NAMES or packet.endswith("_like")


def _is_activation(t: TensorSig, conv: bool) -> bool:
    if t.label == "-" or t.is_param or not t.floating:
        return False
    if t.role == "input":
        return t.arg not in WEIGHT_ARGS
    # a convolution's outputs after the first are weight and bias gradients
    return not (conv and t.position >= 1)


def _definite(label: str) -> str | None:
    fmt = base_format(label)
    return fmt if fmt in _DEFINITE else None


_NONE = Verdict(NOT_APPLICABLE, 0, "", "")


def classify(op: str, tensors: tuple[TensorSig, ...]) -> Verdict:
    """Classify one op call. ``tensors`` holds every tensor argument and result of the call."""
    conv = is_convolution(op)
    acts_in = [t for t in tensors if t.role == "input" and _is_activation(t, conv)]
    acts_out = [t for t in tensors if t.role == "output" and _is_activation(t, conv)]
    if not acts_in and not acts_out:
        return _NONE
    outputs = [t for t in tensors if t.role == "output"]
    if outputs and all(t.is_view for t in outputs):
        return Verdict(VIEW, 0, "", "")
    if is_factory(op):
        return _NONE
    if conv:
        return _classify_convolution(tensors, acts_in, acts_out)
    if op_packet(op) in COPY_OPS:
        return _classify_copy(op, acts_in, acts_out)
    return _classify_compute(acts_in, acts_out)


def _first_label(ts) -> str:
    return ts[0].label if ts else ""


def _classify_compute(acts_in, acts_out) -> Verdict:
    cl_in = [t for t in acts_in if _definite(t.label) in _CL]
    other_in = [t for t in acts_in if _definite(t.label) not in (None, *_CL)]
    dense_out = [t for t in acts_out if not t.is_view and t.label in _DEFINITE]
    lost = [t for t in dense_out if t.label not in _CL]
    if cl_in and lost:
        out = min(lost, key=lambda t: t.position)
        if all(t.arg in _PEER_ARGS for t in cl_in) and any(
            t.arg in _PEER_ARGS and _definite(t.label) == out.label for t in other_in
        ):
            # peers in mixed formats (cat's tensors, add's self and other): the op followed
            # the other one and reordered the channels_last ones. A conversion of those, not
            # missing support; a gradient meeting a saved tensor is not a peer of it.
            return Verdict(CONVERTS, sum(t.nbytes for t in cl_in), cl_in[0].label, out.label)
        return Verdict(LOSES, out.nbytes, cl_in[0].label, out.label)
    cl_out = [t for t in dense_out if t.label in _CL]
    if cl_out and other_in:
        kind = CONVERTS if cl_in else RESTORES
        return Verdict(kind, sum(t.nbytes for t in other_in), other_in[0].label, cl_out[0].label)
    if not any(_definite(t.label) for t in acts_in + acts_out):
        return Verdict(AMBIGUOUS_KIND, 0, _first_label(acts_in), _first_label(acts_out))
    return Verdict(PRESERVES, 0, _first_label(acts_in), _first_label(acts_out))


def _classify_copy(op, acts_in, acts_out) -> Verdict:
    """clone / _to_copy / copy_: a conversion when source and result orders differ."""
    if op_packet(op) == "aten.copy_":
        src = [t for t in acts_in if t.arg == "src"]
    else:
        src = acts_in[:1]
    src_fmt = _definite(src[0].label) if src else None
    dst_fmt = _definite(acts_out[0].label) if acts_out else None
    if src_fmt and dst_fmt and src_fmt != dst_fmt:
        kind = RESTORES if dst_fmt in _CL else CONVERTS
        return Verdict(kind, src[0].nbytes, src[0].label, acts_out[0].label)
    if not src_fmt and not dst_fmt:
        return Verdict(AMBIGUOUS_KIND, 0, _first_label(src), _first_label(acts_out))
    return Verdict(PRESERVES, 0, _first_label(src), _first_label(acts_out))


def _classify_convolution(tensors, acts_in, acts_out) -> Verdict:
    """A convolution computes in one layout; every operand stored in another is permuted first.

    The layout it chose is that of its main result (output, or grad_input in backward; the
    weight gradient when no input gradient was asked for).
    """
    results = [t for t in tensors if t.role == "output" and t.label != "-"]
    if not results:
        return _NONE
    chosen_label = results[0].label
    chosen = _definite(chosen_label)
    weights = [t for t in tensors if t.role == "input" and t.label != "-" and not _is_activation(t, True)]
    if chosen is None:
        kind = AMBIGUOUS_KIND if not any(_definite(t.label) for t in acts_in) else PRESERVES
        return Verdict(kind, 0, _first_label(acts_in), chosen_label)
    if chosen not in _CL:
        cl_in = [t for t in acts_in if _definite(t.label) in _CL]
        if cl_in:
            out = acts_out[0] if acts_out else results[0]
            return Verdict(LOSES, out.nbytes, cl_in[0].label, chosen_label)
    permuted = [t for t in acts_in + weights if _definite(t.label) not in (None, chosen)]
    if permuted:
        return Verdict(CONVERTS, sum(t.nbytes for t in permuted), permuted[0].label, chosen_label)
    return Verdict(PRESERVES, 0, _first_label(acts_in), chosen_label)
