"""The per-op rules: what an op call does to the format of the images it reads and writes.

Two scalar functions decide for one op call from its tensors alone. :func:`flow_facts` says
what its results are (an image, with its channels along which dimension, in which format, and
which format an ambiguous one stands for), from what its inputs were. :func:`classify` says
whether the call preserved, lost, converted or restored channels_last. The recorder's
``strict=True`` calls both online and the analyzer calls them once per distinct op signature,
in the order the ops ran, so the two can never disagree. Which ops lie *between two
convolutions* is the analyzer's business, not this module's.

Composite ops that reach a mode whole under inference_mode (``matmul``, ``linear``,
``reshape``) are judged as their decompositions are; :class:`Rows` follows an image through a
decomposed Linear over its channels; :func:`layout_policy` says how an op lays out what it
writes, for the analyzer's layout provenance.
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
    is_dense,
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
#: Peers joined along a dimension (cat's and stack's list): their shapes may differ, so a peer
#: of the image's rank meets it whatever its size along the joined dimension.
_JOINED_ARGS = frozenset({"tensors"})

#: Ops that copy their input into a layout somebody chose: a conversion, never a loss. The
#: composite ones (contiguous, to, reshape, flatten) reach a mode undecomposed under
#: inference_mode, and copy only when they cannot return a view.
COPY_OPS = frozenset({
    "aten.clone", "aten._to_copy", "aten.copy_", "aten.copy", "aten._copy_from",
    "aten.contiguous", "aten.to", "aten.type_as", "aten.reshape", "aten.reshape_as", "aten.flatten",
})
#: Copies that reshape: a copy into contiguous order, whatever the result's rank.
_RESHAPE_COPIES = frozenset({"aten.reshape", "aten.reshape_as", "aten.flatten"})
#: Ops that reshape their input: a view where the strides allow one, else a copy (the view ops
#: and reshape's pieces as they reach a mode: ``_unsafe_view`` follows the copy reshape makes).
RESHAPES = frozenset({"aten.view", "aten._unsafe_view", "aten._reshape_alias", *_RESHAPE_COPIES})
#: Matrix products that reach a mode whole under inference_mode and as reshapes around
#: ``mm``/``bmm`` otherwise; they fold the dimensions before the rows into one (a reshape).
_MATMULS = frozenset({"aten.matmul", "aten.linear"})
#: Matrix products of 2-D tensors and the argument that holds the rows they write.
_ROW_PRODUCTS = {"aten.mm": "self", "aten.addmm": "mat1"}

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


def folds(op: str) -> bool:
    """An op that reshapes (``reshape``, ``flatten``) or folds an operand's dimensions into
    rows or a batch (``matmul``, ``linear``) as it reaches a mode whole: a copy it makes is
    a reshape's."""
    packet = op_packet(op)
    return packet in _RESHAPE_COPIES or packet in _MATMULS


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


# -- layout policies ----------------------------------------------------------------------------
#
# How an op chooses the strides of what it writes, for layout provenance (which tensors have a
# layout the model's code fixes whatever memory format the model and its input are in; see
# ``auditor._analysis._ops``). These are the policies of this torch's ATen kernels.

#: It writes in its own logical order whatever it reads: the matrix products, layer norm and
#: softmax (and their backwards), gathers, the backwards that scatter into zeros, a reshape that
#: had to copy, a copy or a factory asked for a memory format, a factory of new memory.
LAYOUT_OWN = "own"
#: It writes channels_last exactly when its input's dimension 1 is innermost
#: (``suggest_memory_format``): padding, pooling, batch and group norm, upsampling.
LAYOUT_SUGGESTED = "suggested"
#: A convolution: it computes in channels_last when its input (or its weight) is.
LAYOUT_CONVOLUTION = "convolution"
#: It lays its result out as its inputs are (TensorIterator: elementwise ops and reductions;
#: ``cat``, which keeps its inputs' common format; a copy or a ``*_like`` factory that
#: preserves its input's format).
LAYOUT_FOLLOWS = "follows"
#: An elementwise kernel or reduction (TensorIterator): its result takes the dimension order of
#: the first operand whose strides tell two dimensions apart, so a dense operand of the result's
#: shape with a definite format decides every order the operands before it did not.
LAYOUT_ITERATOR = "iterator"
#: Its strides are arguments (``empty_strided``, ``as_strided``): autograd copies them from a
#: tensor the log does not name.
LAYOUT_STRIDED = "strided"
#: None of these is known for it.
LAYOUT_UNKNOWN = ""

_OWN_ORDER = frozenset({
    "aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm", "aten.addbmm", "aten.matmul", "aten.linear",
    "aten.native_layer_norm", "aten.native_layer_norm_backward", "aten.layer_norm",
    "aten._softmax", "aten._log_softmax", "aten.softmax", "aten.log_softmax",
    "aten._softmax_backward_data", "aten._log_softmax_backward_data",
    "aten.gather", "aten.index_select", "aten.embedding", "aten.embedding_dense_backward",
    "aten.slice_backward", "aten.select_backward", "aten.index_select_backward", "aten.unfold_backward",
    "aten.im2col", "aten.col2im", "aten.scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu", *_RESHAPE_COPIES,
})
_SUGGESTED = frozenset({
    "aten.constant_pad_nd", "aten.pad", "aten.reflection_pad1d", "aten.reflection_pad2d", "aten.reflection_pad3d",
    "aten.replication_pad1d", "aten.replication_pad2d", "aten.replication_pad3d",
    "aten.native_batch_norm", "aten._native_batch_norm_legit", "aten._native_batch_norm_legit_no_training",
    "aten._native_batch_norm_legit_functional", "aten.batch_norm", "aten.native_batch_norm_backward",
    "aten.native_group_norm", "aten.group_norm", "aten.native_group_norm_backward",
    "aten.max_pool2d", "aten.max_pool2d_with_indices", "aten.max_pool2d_with_indices_backward",
    "aten.max_pool3d_with_indices", "aten.max_pool3d_with_indices_backward",
    "aten.avg_pool2d", "aten.avg_pool2d_backward", "aten.avg_pool3d", "aten.avg_pool3d_backward",
    "aten._adaptive_avg_pool2d", "aten._adaptive_avg_pool2d_backward", "aten.adaptive_avg_pool2d",
    "aten._adaptive_avg_pool3d", "aten._adaptive_avg_pool3d_backward",
    "aten.adaptive_max_pool2d", "aten.adaptive_max_pool2d_backward",
})
#: cat and stack keep their inputs' common format (contiguous when they differ).
_FOLLOWS = frozenset({"aten.cat", "aten.stack"})
#: Elementwise kernels (TensorIterator) that carry no pointwise tag (the analyzer asks torch's
#: tags about the others).
_ITERATOR = frozenset({
    "aten.native_dropout", "aten.hardswish", "aten.hardswish_",
    "aten.hardswish_backward", "aten.hardsigmoid_backward", "aten.hardtanh_backward", "aten.leaky_relu_backward",
    "aten.elu_backward", "aten.softplus_backward", "aten.mish_backward", "aten.log_sigmoid_forward",
    "aten.log_sigmoid_backward", "aten._prelu_kernel", "aten._prelu_kernel_backward",
})
_STRIDED = frozenset({"aten.empty_strided", "aten.new_empty_strided", "aten.as_strided", "aten.as_strided_"})
#: requested formats that fix a copy's layout (``preserve_format`` follows the input)
_FIXED_FORMATS = frozenset({"contiguous_format", "channels_last", "channels_last_3d"})


def layout_policy(op: str, requested: str = "") -> str:
    """How ``op`` lays out what it writes (one of the ``LAYOUT_*`` policies), given the memory
    format it was asked for (``events.requested_format``, "" when none was given)."""
    packet = op_packet(op)
    if packet in _STRIDED:
        return LAYOUT_STRIDED
    if packet in COPY_OPS:
        if packet in _RESHAPE_COPIES:
            return LAYOUT_OWN  # a reshape that returns no view wrote a contiguous copy
        if requested in _FIXED_FORMATS or (packet == "aten.contiguous" and not requested):
            return LAYOUT_OWN
        return LAYOUT_FOLLOWS
    if is_factory(op):
        return LAYOUT_FOLLOWS if packet.endswith("_like") and requested not in _FIXED_FORMATS else LAYOUT_OWN
    if is_convolution(op):
        return LAYOUT_CONVOLUTION
    if packet in _OWN_ORDER:
        return LAYOUT_OWN
    if packet in _SUGGESTED or packet.startswith(("aten.upsample_", "aten._upsample_")):
        return LAYOUT_SUGGESTED
    if packet in _FOLLOWS:
        return LAYOUT_FOLLOWS
    if packet in _ITERATOR:
        return LAYOUT_ITERATOR
    return LAYOUT_UNKNOWN


# -- facts ------------------------------------------------------------------------------------


def plain_facts(t: TensorSig) -> Facts:
    """The facts of a tensor the data flow knows nothing about (a model input, a parameter)."""
    return Facts(False, 1, len(t.shape), t.label, definite(t.label) or "")


def flow_facts(op: str, tensors: tuple[TensorSig, ...]) -> tuple[Facts, ...]:
    """The facts of each result of one op call, in the order of the results in ``tensors``,
    from the facts its inputs carry.

    A convolution's main result is an image in the layout the convolution computed in. Any
    other op's floating 4-D/5-D result is an image when its first image input is, and the
    channels can be followed into it (:func:`~auditor._recording._formats.channel_dim`); an
    ambiguous one (N×C×1×1, N×1×H×W) stands for the format that input's data came in.
    """
    conv = is_convolution(op)
    outputs = [t for t in tensors if t.role == "output"]
    if conv:
        return tuple(_conv_result_facts(tensors, t) for t in outputs)
    source = next((t for t in tensors if t.role == "input" and t.image and t.floating and not t.is_param
                   and t.arg not in WEIGHT_ARGS), None)
    packet = op_packet(op)
    if source is not None and packet in _MATMULS:
        product = _matrix_product(op, tensors)
        if product is None or not product[2]:
            # its channels folded into the rows, or contracted: what the decomposition's 2-D or
            # 3-D pieces make of it too
            return tuple(plain_facts(t) for t in outputs)
    if source is not None and packet in _RESHAPE_COPIES:
        # a reshape that copied holds what its decomposition's view of a contiguous copy holds
        copied = source._replace(strides=_contiguous_strides(source.shape))
        return tuple(_result_facts(source, t) if t.is_view else _result_facts(copied, t._replace(is_view=True))
                     for t in outputs)
    return tuple(_result_facts(source, t) for t in outputs)


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


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


def _matrix_product(op: str, tensors) -> tuple[TensorSig, tuple[int, ...], bool] | None:
    """A ``matmul`` or ``linear`` of an image, as its decomposition runs it: (the image operand,
    the dimensions of it the product folds into one by a reshape, whether the result is an image
    with its channels last), or None when no operand is an image.

    A product with a matrix (``linear``'s weight, a 2-D ``other``) folds every dimension of the
    larger operand but the last into rows (``view(-1, C)``, then ``mm``); one of two batches of
    matrices folds the dimensions before the last two (``reshape``, then ``bmm``). Only a
    product of the rows of an image whose channels are its last dimension is that image again
    (a Linear over the channels); the batched product's 3-D pieces hold no image."""
    ins = [t for t in tensors if t.role == "input" and t.floating and t.arg not in ("weight", "bias")]
    image = next((t for t in ins if t.image and not t.is_param), None)
    if image is None or len(image.shape) < 3:
        return None
    others = [t for t in tensors if t.role == "input" and t is not image and t.arg in ("self", "other", "weight")]
    fold = op_packet(op) == "aten.linear" or all(len(t.shape) <= 2 for t in others)
    first = image.arg in ("self", "input")
    rank = len(image.shape)
    if not fold:
        merged = tuple(range(rank - 2))
    elif first:
        merged = tuple(range(rank - 1))
    else:  # the matrix times a batch of them: the batch is folded transposed
        merged = tuple(d for d in range(rank) if d != rank - 2)
    return image, merged, fold and first and image.cdim == rank - 1


def _views_as_one(shape, strides, dims) -> bool:
    """Whether the dimensions ``dims`` (in order) merge into one by a view: each of size > 1
    steps over the next one's extent."""
    dims = [d for d in dims if shape[d] != 1]
    return all(strides[a] == strides[b] * shape[b] for a, b in zip(dims, dims[1:]))


def _classify_matrix_product(op: str, tensors) -> Verdict | None:
    """A ``matmul``/``linear`` that reaches a mode whole, as its decomposition is classified: a
    conversion when the reshape that folds the image's channels into the rows or the batch
    has to copy a layout that cannot be viewed so (a channels_last image's channels are
    innermost), nothing when there is no image left, else (a Linear over the channels) the
    computation's own verdict (None)."""
    product = _matrix_product(op, tensors)
    if product is None:
        return None
    image, merged, keeps = product
    if image.cdim in merged and not _views_as_one(image.shape, image.strides, merged):
        return Verdict(CONVERTS, image.nbytes, image.label, CONTIGUOUS)
    return None if keeps else _NONE


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


# -- rows: a Linear over the channels, decomposed -------------------------------------------------


class Rows(NamedTuple):
    """A 2-D tensor that holds an image's channel vectors, one row per pixel: ``view(-1, C)`` of
    an image whose channels are its last dimension (an NHWC view), and what ``mm``/``addmm``
    make of those rows. A Linear over the channels reaches a mode so, unless it comes whole
    (``aten.linear`` under inference_mode), and its result is reshaped back to the image's sizes."""

    lead: tuple[int, ...]  # the image's sizes before its channels
    rank: int  # the rank of the image (4 or 5)
    effective: str  # the image's effective format


def moves_rows(op: str) -> bool:
    """Whether ``op`` can make rows of an image, carry them, or make them an image again."""
    packet = op_packet(op)
    return packet in RESHAPES or packet in _ROW_PRODUCTS


def rows_written(op: str, inputs: list[tuple[TensorSig, Rows | None]], out: TensorSig) -> Rows | None:
    """The rows a result of ``op`` holds, from its inputs (each with its facts, and its rows or
    None): a reshape of an image whose channels are last into (pixels, C), a reshape of rows that
    keeps them, or a matrix product whose left operand holds rows (same pixels, new channels)."""
    if len(out.shape) != 2:
        return None
    packet = op_packet(op)
    if packet in RESHAPES and inputs:
        src, rows = inputs[0]
        if rows is not None:
            return rows if out.shape[0] == _numel(rows.lead) else None
        if (src.image and len(src.shape) in (4, 5) and src.cdim == len(src.shape) - 1
                and tuple(out.shape) == (_numel(src.shape[:-1]), src.shape[-1])):
            return Rows(tuple(src.shape[:-1]), src.rank or len(src.shape), src.effective)
        return None
    arg = _ROW_PRODUCTS.get(packet)
    rows = next((r for t, r in inputs if t.arg == arg), None) if arg else None
    return rows if rows is not None and out.shape[0] == _numel(rows.lead) else None


def image_of_rows(op: str, rows: Rows, out: TensorSig) -> Facts | None:
    """A reshape of rows back to the image's sizes with new channels last: the image again."""
    if (op_packet(op) not in RESHAPES or not out.floating or len(out.shape) != len(rows.lead) + 1
            or tuple(out.shape[:-1]) != rows.lead):
        return None
    cdim = len(out.shape) - 1
    label = channel_label(out.shape, out.strides, cdim, rows.rank)
    return Facts(True, cdim, rows.rank, label, definite(label) or rows.effective)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


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
    packet = op_packet(op)
    if packet in COPY_OPS:
        return _classify_copy(op, acts_in, acts_out)
    if packet in _MATMULS:
        verdict = _classify_matrix_product(op, tensors)
        if verdict is not None:
            return verdict
    verdict = _classify_compute(acts_in, acts_out)
    if verdict.kind in COSTLY_KINDS and _moved_nothing(acts_in, acts_out):
        return Verdict(PRESERVES, 0, verdict.from_format, verdict.to_format)
    return verdict


def _with_peers(tensors, acts_in: list[TensorSig]) -> list[TensorSig]:
    """An operand the data flow does not know as an image (a tensor reshaped back from
    tokens, say) is one when it meets an image of its shape as a peer (``add``'s ``other``,
    one of ``cat``'s tensors): the op must bring both into one layout. One of the tensors
    ``cat`` or ``stack`` joins meets an image of its rank, whatever its size along the joined
    dimension (a 2-channel flow concatenated to a map). It is judged as that image: labelled
    with the image's channel dimension and rank, so that an NHWC operand beside an NHWC view of
    an image reads as what it is, not as if H were its channels."""
    images: dict[tuple, TensorSig] = {}
    joined: dict[int, TensorSig] = {}  # a joined list's first image of each rank
    for t in acts_in:
        if t.arg in _PEER_ARGS:
            images.setdefault(t.shape, t)
        if t.arg in _JOINED_ARGS:
            joined.setdefault(len(t.shape), t)
    peers = [_judged_as(t, images.get(t.shape) or joined[len(t.shape)]) for t in tensors
             if t.role == "input" and t.image is False and t.arg in _PEER_ARGS and t.floating and not t.is_param
             and t.label != "-" and (t.shape in images or (t.arg in _JOINED_ARGS and len(t.shape) in joined))]
    return acts_in + peers if peers else acts_in


def _judged_as(t: TensorSig, image: TensorSig) -> TensorSig:
    """``t``, labelled as an image with ``image``'s channel dimension and rank."""
    rank = image.rank or len(t.shape)
    label = channel_label(t.shape, t.strides, image.cdim, rank)
    return t._replace(cdim=image.cdim, rank=rank, label=label, effective=definite(label) or t.effective)


def _moved_nothing(acts_in, acts_out) -> bool:
    """Every operand and result is dense, of one shape, with the same strides (size-1
    dimensions aside): the op read and wrote one physical order, so it lost, converted and
    restored nothing, whatever the operands' labels say."""
    outs = [t for t in acts_out if not t.is_view]
    if not outs or not acts_in:
        return False
    shape, strides = outs[0].shape, outs[0].strides
    if not shape or len(strides) != len(shape) or not is_dense(shape, strides):
        return False
    return all(t.shape == shape and len(t.strides) == len(shape)
               and all(a == b for a, b, n in zip(t.strides, strides, shape) if n != 1)
               for t in (*acts_in, *outs))


def _first_label(ts) -> str:
    return ts[0].label if ts else ""


def _classify_compute(acts_in, acts_out) -> Verdict:
    # an operand without elements (an empty update, a level no region fell in) moves no data
    acts_in = [t for t in acts_in if 0 not in t.shape]
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
    # an operand in both formats at once (N×1×H×W, N×C×1×1, broadcast or not) is read in the
    # one physical order both share: only an operand of a definite other format is reordered
    moved = [t for t in other_in if definite(t.label)]
    if cl_out and moved:
        kind = CONVERTS if cl_in else RESTORES
        return Verdict(kind, sum(t.nbytes for t in moved), moved[0].label, cl_out[0].label)
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
