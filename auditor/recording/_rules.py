"""The per-op rules: what an op call does to the format of the images it reads and writes.

Two scalar functions decide for one op call from its tensors alone. :func:`flow_facts` says
what its results are (an image, with its channels along which dimension, in which format, and
which format an ambiguous one stands for), from what its inputs were. :func:`classify` says
whether the call preserved, lost, converted or restored channels_last. The recorder's
``strict=True`` calls both online and the analyzer calls them once per distinct op signature,
in the order the ops ran, so the two can never disagree. Which ops lie *between two
convolutions* is the analyzer's business, not this module's.
"""

from __future__ import annotations

from typing import NamedTuple

from ._formats import (
    CHANNELS_LAST,
    CHANNELS_LAST_3D,
    CONTIGUOUS,
    OTHER,
    base_format,
    channel_dim,
    channel_label,
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

#: Ops that copy their input into a layout somebody chose: a conversion, never a loss. The
#: composite ones (contiguous, to, reshape, flatten) reach a mode undecomposed under
#: inference_mode, and copy only when they cannot return a view.
COPY_OPS = frozenset({
    "aten.clone", "aten._to_copy", "aten.copy_", "aten.copy", "aten._copy_from",
    "aten.contiguous", "aten.to", "aten.type_as", "aten.reshape", "aten.reshape_as", "aten.flatten",
})
#: Copies that reshape: a copy into contiguous order, whatever the result's rank.
_RESHAPE_COPIES = frozenset({"aten.reshape", "aten.reshape_as", "aten.flatten"})

#: Convolutions as they reach a mode: the native op and its backward, the backends' kernels, and
#: the composite entry points that inference_mode lets through undecomposed.
_CONVOLUTIONS = frozenset({
    "aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose1d", "aten.conv_transpose2d",
    "aten.conv_transpose3d", "aten.conv_tbc", "aten.cudnn_convolution_transpose",
})

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


class Facts(NamedTuple):
    """What the data flow knows about a tensor when it is written (see :func:`flow_facts`)."""

    image: bool  # an image: a convolution's channels, followed along the data flow
    cdim: int  # the dimension its channels run along (1 unless a view or stack moved them)
    rank: int  # the rank of the image it holds (4 or 5), whatever its own
    label: str  # its format label as that image (formats.channel_label)
    effective: str  # its definite format or, for an ambiguous one, the one its data came in


class TensorSig(NamedTuple):
    """What the rules need to know about one tensor argument or result."""

    role: str  # "input" or "output"
    position: int  # schema argument index (inputs) or return index (outputs)
    arg: str  # schema argument name ("" for outputs)
    label: str  # formats.format_label; for an image, formats.channel_label
    is_param: bool
    is_view: bool  # output aliases an input without writing it
    nbytes: int
    floating: bool = True  # floating or complex dtype; indices and masks are never activations
    shape: tuple = ()
    strides: tuple = ()
    image: bool | None = None  # Facts.image; None: not known, judge by argument (the old rule)
    cdim: int = 1
    rank: int = 0
    effective: str = ""  # Facts.effective: what an ambiguous input stands for

    def with_facts(self, facts: Facts) -> TensorSig:
        return self._replace(image=facts.image, cdim=facts.cdim, rank=facts.rank, label=facts.label,
                             effective=facts.effective)


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
    return "convolution" in packet or packet in _CONVOLUTIONS or packet.startswith(
        ("aten._slow_conv", "aten.slow_conv", "aten.thnn_conv", "aten._conv_depthwise", "aten.conv_depthwise")
    )


def is_copy(op: str) -> bool:
    """A copy into a layout somebody chose (``clone``, ``contiguous``, ``to``, ``copy_``, a
    reshape that copies)."""
    return op_packet(op) in COPY_OPS


def is_factory(op: str) -> bool:
    packet = op_packet(op)
    return packet in _FACTORY_NAMES or packet.endswith("_like")


def _is_activation(t: TensorSig, conv: bool) -> bool:
    if t.label == "-" or t.is_param or not t.floating:
        return False
    if t.image is not None and not (conv and t.role == "input"):
        return t.image  # what the data flow knows; a convolution's input is always one
    if t.role == "input":
        return t.arg not in WEIGHT_ARGS
    # a convolution's outputs after the first are weight and bias gradients
    return not (conv and t.position >= 1)


def definite(label: str) -> str | None:
    """The format a label names (its ``_view`` suffix dropped), unless it names none."""
    fmt = base_format(label)
    return fmt if fmt in _DEFINITE else None



def _effective(t: TensorSig) -> str | None:
    """The definite format an input is in, or for an ambiguous one the one its data came in."""
    return definite(t.label) or definite(t.effective)


# -- facts ------------------------------------------------------------------------------------


def plain_facts(t: TensorSig) -> Facts:
    """The facts of a tensor the data flow knows nothing about (a model input, a parameter)."""
    return Facts(False, 1, len(t.shape), t.label, definite(t.label) or "")


def flow_facts(op: str, tensors: tuple[TensorSig, ...]) -> tuple[Facts, ...]:
    """The facts of each result of one op call, in the order of the results in ``tensors``,
    from the facts its inputs carry.

    A convolution's main result is an image in the layout the convolution computed in. Any
    other op's floating 4-D/5-D result is an image when its first image input is, and the
    channels can be followed into it (:func:`~auditor.recording._formats.channel_dim`); an
    ambiguous one (N×C×1×1, N×1×H×W) stands for the format that input's data came in.
    """
    conv = is_convolution(op)
    outputs = [t for t in tensors if t.role == "output"]
    if conv:
        return tuple(_conv_result_facts(tensors, t) for t in outputs)
    source = next((t for t in tensors if t.role == "input" and t.image and t.floating and not t.is_param
                   and t.arg not in WEIGHT_ARGS), None)
    return tuple(_result_facts(source, t) for t in outputs)


def _conv_result_facts(tensors, out: TensorSig) -> Facts:
    if out.position != 0 or not out.floating or len(out.shape) not in (4, 5) or out.label == "-":
        return plain_facts(out)  # weight gradients; a result without strides (mkldnn) holds no image we follow
    made = definite(out.label)
    if made is None:  # an ambiguous result: the layout of what the convolution read
        ins = [t for t in tensors if t.role == "input" and t.arg not in WEIGHT_ARGS and t.floating]
        weights = [t for t in tensors if t.role == "input" and t.arg == "weight"]
        made = next((_effective(t) for t in ins if _effective(t)), None) or next(
            (definite(t.label) for t in weights if definite(t.label)), None) or ""
    return Facts(True, 1, len(out.shape), out.label, made)


def _result_facts(source: TensorSig | None, out: TensorSig) -> Facts:
    if source is None or not out.floating or len(out.shape) not in (4, 5):
        return plain_facts(out)
    cdim = channel_dim(source.shape, source.strides, source.cdim, out.shape, out.strides, out.is_view)
    if cdim is None:
        return plain_facts(out)
    rank = source.rank or len(source.shape)
    label = channel_label(out.shape, out.strides, cdim, rank)
    return Facts(True, cdim, rank, label, definite(label) or _effective(source) or "")


_NONE = Verdict(NOT_APPLICABLE, 0, "", "")


def classify(op: str, tensors: tuple[TensorSig, ...]) -> Verdict:
    """Classify one op call. ``tensors`` holds every tensor argument and result of the call."""
    conv = is_convolution(op)
    acts_in = [t for t in tensors if t.role == "input" and _is_activation(t, conv)]
    acts_out = [t for t in tensors if t.role == "output" and _is_activation(t, conv)]
    outputs = [t for t in tensors if t.role == "output"]
    if not acts_in and not acts_out:
        # a view of a tensor that is not an image is still a view
        viewed = outputs and all(t.is_view for t in outputs) and any(
            _is_activation(t._replace(image=None), conv) for t in tensors)
        return Verdict(VIEW, 0, "", "") if viewed else _NONE
    if not conv and acts_in:
        acts_in = _with_peers(tensors, acts_in)
    if outputs and all(t.is_view for t in outputs):
        return Verdict(VIEW, 0, "", "")
    if is_factory(op):
        return _NONE
    if conv:
        return _classify_convolution(tensors, acts_in, acts_out)
    if op_packet(op) in COPY_OPS:
        return _classify_copy(op, acts_in, acts_out)
    return _classify_compute(acts_in, acts_out)


def _with_peers(tensors, acts_in: list[TensorSig]) -> list[TensorSig]:
    """An operand the data flow does not know as an image (a tensor reshaped back from
    tokens, say) is one when it meets an image of its shape as a peer (``add``'s ``other``,
    one of ``cat``'s tensors): the op must bring both into one layout."""
    shapes = {t.shape for t in acts_in if t.arg in _PEER_ARGS}
    peers = [t for t in tensors if t.role == "input" and t.image is False and t.arg in _PEER_ARGS
             and t.floating and not t.is_param and t.shape in shapes and t.label != "-"]
    return acts_in + peers if peers else acts_in


def _first_label(ts) -> str:
    return ts[0].label if ts else ""


def _classify_compute(acts_in, acts_out) -> Verdict:
    cl_in = [t for t in acts_in if _effective(t) in _CL]
    other_in = [t for t in acts_in if _effective(t) not in (None, *_CL)]
    dense_out = [t for t in acts_out if not t.is_view and t.label in _DEFINITE]
    lost = [t for t in dense_out if t.label not in _CL]
    if cl_in and lost:
        out = min(lost, key=lambda t: t.position)
        if all(t.arg in _PEER_ARGS for t in cl_in) and any(
            t.arg in _PEER_ARGS and _effective(t) == out.label for t in other_in
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
    if not any(definite(t.label) for t in acts_in + acts_out):
        return Verdict(AMBIGUOUS_KIND, 0, _first_label(acts_in), _first_label(acts_out))
    return Verdict(PRESERVES, 0, _first_label(acts_in), _first_label(acts_out))


def _classify_copy(op, acts_in, acts_out) -> Verdict:
    """clone / _to_copy / copy_: a conversion when source and result orders differ."""
    if op_packet(op) == "aten.copy_":
        src = [t for t in acts_in if t.arg == "src"]
    else:
        src = acts_in[:1]
    src_fmt = _effective(src[0]) if src else None
    dst_fmt = definite(acts_out[0].label) if acts_out else None
    if dst_fmt is None and src_fmt in _CL and op_packet(op) in _RESHAPE_COPIES:
        # a reshape that had to copy wrote contiguous order, whatever rank it returned
        return Verdict(CONVERTS, src[0].nbytes, src[0].label, CONTIGUOUS)
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
    chosen = definite(chosen_label)
    weights = [t for t in tensors if t.role == "input" and t.label != "-" and not _is_activation(t, True)]
    if chosen is None:
        kind = AMBIGUOUS_KIND if not any(definite(t.label) for t in acts_in) else PRESERVES
        return Verdict(kind, 0, _first_label(acts_in), chosen_label)
    if chosen not in _CL:
        cl_in = [t for t in acts_in if _effective(t) in _CL]
        if cl_in:
            out = acts_out[0] if acts_out else results[0]
            return Verdict(LOSES, out.nbytes, cl_in[0].label, chosen_label)
    permuted = [t for t in acts_in + weights if definite(t.label) not in (None, chosen)]
    if permuted:
        return Verdict(CONVERTS, sum(t.nbytes for t in permuted), permuted[0].label, chosen_label)
    return Verdict(PRESERVES, 0, _first_label(acts_in), chosen_label)
