"""Choosing a format per convolution: an exact minimum cut over two labels, its energy, and
the regions of same-format convolutions it makes."""

from __future__ import annotations


def min_cut(names: list[str], unary: dict[str, dict[str, float]], pair: dict[tuple, dict[str, float]],
            tied: list[list[str]] = ()) -> dict[str, str]:
    """Exact minimiser of sum(unary) + sum(pairwise border costs) over two labels.

    Graph cut: a node on the source side runs contiguous, on the sink side channels_last;
    ``pair[(a, b)]["cl_to_c"]`` is paid when a is channels_last and b contiguous, and
    ``["c_to_cl"]`` the other way round. All costs are non-negative, so the cut is exact. The
    names of each list in ``tied`` get one label (edges no cut can afford join them).
    """
    import networkx as nx  # a dependency of torch, declared in pyproject.toml

    g = nx.DiGraph()
    s, t = ("<source>",), ("<sink>",)
    for n in names:
        g.add_edge(s, n, capacity=unary[n]["channels_last"])
        g.add_edge(n, t, capacity=unary[n]["contiguous"])
    for (a, b), cost in pair.items():
        for u, v, c in ((a, b, cost["c_to_cl"]), (b, a, cost["cl_to_c"])):
            if c > 0:
                cap = g[u][v]["capacity"] + c if g.has_edge(u, v) else c
                g.add_edge(u, v, capacity=cap)
    # more than every finite edge together: cutting a tie never pays
    big = 1.0 + sum(d["capacity"] for _, _, d in g.edges(data=True))
    for group in tied:
        for a, b in zip(group, group[1:]):
            for u, v in ((a, b), (b, a)):
                g.add_edge(u, v, capacity=big + (g[u][v]["capacity"] if g.has_edge(u, v) else 0.0))
    _, (s_side, _) = nx.minimum_cut(g, s, t)
    return {n: "contiguous" if n in s_side else "channels_last" for n in names}


def energy(labels: dict[str, str], unary, pair) -> float:
    """The cost the cut minimises, for one labelling: unary costs plus border costs."""
    total = sum(unary[n][labels[n]] for n in labels)
    for (a, b), cost in pair.items():
        if labels[a] != labels[b]:
            total += cost["c_to_cl"] if labels[a] == "contiguous" else cost["cl_to_c"]
    return total


def regions(names: list[str], labels: dict[str, str], pair) -> dict[str, int]:
    """Connected groups of same-format convolutions, numbered in execution order."""
    parent = {n: n for n in names}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for a, b in pair:
        if labels[a] == labels[b]:
            parent[find(a)] = find(b)
    number, out = {}, {}
    for n in names:
        out[n] = number.setdefault(find(n), len(number))
    return out
