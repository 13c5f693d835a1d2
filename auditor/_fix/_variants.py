"""Every fix the engine knows, declared by name in the order it is tried: the generators of each
cause pattern, and the variants inside a family (the ways a ``joins`` cause's tensor is made a
map in the format, each a detector beside its rewrite). Plain data, loaded by path to build the
docs' table without importing torch; :mod:`._registry` binds each name to its code and refuses
a name declared here without code, or code without a name here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Declared:
    """One fix generator, or one variant of a family's fix."""

    name: str
    family: str  #: the module under ``auditor/_fix/_generators/`` its code is in
    patterns: tuple[str, ...]  #: the cause patterns it fixes (a variant: its family's pattern)
    does: str  #: what it changes, in a few words, for the docs


def _fix(name, family, patterns, does) -> Declared:
    return Declared(name, family, tuple(patterns.split()), does)


#: the fix generators; for each pattern, those that serve it are tried in this order and the
#: first that has a fix gives it
GENERATORS: tuple[Declared, ...] = (
    _fix("canvas in the format", "_canvas", "joins",
         "a new map that maps are written into by index made with torch.empty in the format of the tensor it is "
         "made like"),
    _fix("group norm on the (B, C, 1, L) view", "_norm_view", "joins loses",
         "a group norm of a map's tokens (channels innermost) run on their (B, C, 1, L) view, channels_last"),
    _fix("re-stride", "_replacements", "nc11_broadcast",
         "a map both formats at once passed re-strided into the convolutions' format (a view)"),
    _fix("product backward", "_replacements", "joins loses",
         "a product whose backward writes a gradient row-major called as keep_format.matmul"),
    _fix("format-keeping replacement", "_replacements", "no_cl_kernel joins loses",
         "an op without a channels_last kernel called as its keep_format replacement"),
    _fix("torch module's own copy", "_swaps", "explicit_copy joins loses",
         "a torch module whose own computation loses the format swapped for one that keeps it"),
    _fix("explicit copy", "_copies", "explicit_copy", "the .contiguous() asks for the format"),
    _fix("mean by sum", "_reductions", "mean_backward",
         "a mean over H and W as a sum divided by H·W (or its pooling module swapped)"),
    _fix("stack reduced", "_reductions", "stack_reduce", "a stack reduced along the stack as the sum of the branches"),
    _fix("broadcast", "_reductions", "nc11_broadcast",
         "an N×C×1×1 map interpolated as a broadcast; a mean over the channels as a sum"),
    _fix("split keeping the format", "_slices", "channel_slice",
         "a split or chunk of a map called as keep_format's, whose backward writes the gradient in the map's format"),
    _fix("slices as a split", "_slices", "channel_slice", "slices of the channels taken as one split"),
    _fix("out of place", "_copies", "inplace_view", "an in-place op on a view written out of place"),
    _fix("weight flattened in memory order", "_copies", "weight_rebuilt",
         "a rebuilt weight flattened in its memory order"),
    _fix("channel shuffle", "_shuffle", "channel_shuffle",
         "the statements of a channel shuffle as one torch channel_shuffle call"),
    _fix("module swap", "_swaps", "no_cl_kernel", "a module without a kernel swapped for one that keeps the format"),
    _fix("whole slice skipped", "_slices", "no_cl_kernel", "a slice that keeps every channel skipped"),
    _fix("convolution as a Conv2d", "_swaps", "conv_no_kernel",
         "a Conv3d that spans time or space alone computed as a Conv2d"),
    _fix("a Conv1d over a map's positions as a Conv2d", "_swaps", "conv_no_kernel",
         "a Conv1d fed a flattened channels_last map computed as a Conv2d over its (N, C, 1, L) view"),
    _fix("weight converted", "_swaps", "weight_format", "a convolution weight stored in the format it computes in"),
    _fix("joins", "_joins", "joins", "the first of the join variants below that verification proves"),
    _fix("the map's own convolutions kept contiguous", "_regions", "joins",
         "a map made from no image that no join variant rewrites: the convolutions that compute on it before it "
         "meets an image run contiguous, as it is made (an attention's talking heads)"),
    _fix("odd tensor converted", "_mixed_join", "mixed_join",
         "the tensor of a join in another format converted to the others' format"),
    _fix("region kept contiguous", "_regions", "no_cl_kernel reshape_merge conv_no_kernel loses",
         "the convolutions around the op run contiguous (the last resort)"),
)

#: the variants of a family's fix, in the order verification tries their candidates
VARIANTS: tuple[Declared, ...] = (
    _fix("gathered upstream", "_gather_above", "joins",
         "an op that reads a map gathered from windows on another line gets that gather's candidate below"),
    _fix("windows gathered in the caller's format", "_gather_above", "joins",
         "windows gathered into a map in NHWC order, made in the format of the map the calling module was given "
         "(no weight in reach)"),
    _fix("tokens to a map", "_join_maps", "joins",
         "a (B, C, N) tensor reshaped into a map written in NHWC order (reshape, then permute)"),
    _fix("a map split into windows", "_join_maps", "joins",
         "a map cut into windows or heads read in NHWC order (permute, reshape, permute back)"),
    _fix("windows gathered into a map", "_join_maps", "joins",
         "windows or heads gathered back into a map with the channels permuted last"),
    _fix("a map unfolded on its NHWC view", "_join_unfold", "joins",
         "a map unfolded into overlapping windows (x.unfold(2, k, s).unfold(3, k, s)) on its NHWC view, so the "
         "unfold's backward makes the map's gradient in NHWC order"),
    _fix("a copy of a channels_last view", "_join_copies", "joins",
         "the copy of a map that is a channels_last view dropped, or made in the format"),
    _fix("the copy made at the caller", "_join_copies", "joins",
         "the copy dropped where no weight is in reach and made, in the format, where the module calls it"),
    _fix("a copy of channels-innermost tokens", "_join_copies", "joins",
         "tokens whose channels lie innermost copied into the format"),
    _fix("the product transposed", "_join_products", "joins",
         "a product that makes a map computed transposed, so it writes NHWC order"),
    _fix("a chain of reshapes", "_join_chains", "joins",
         "reshapes and permutes over several statements gathered in NHWC order in one copy (a map cut into "
         "windows read in its memory order too)"),
    _fix("the new tensor meets an image", "_join_products", "joins",
         "a new tensor copied into the format of the image it is first added to or multiplied with"),
    _fix("a chain read in memory order", "_join_chains", "reshape_merge",
         "reshapes and permutes that cut a map into patches read it in its memory order (NHWC)"),
)


def declared(name: str, table: tuple[Declared, ...] = GENERATORS + VARIANTS) -> Declared:
    """The declaration named ``name``; ``KeyError`` naming the known ones for any other."""
    for d in table:
        if d.name == name:
            return d
    raise KeyError(f"no fix is declared as {name!r}; the declared ones: {', '.join(d.name for d in table)}")
