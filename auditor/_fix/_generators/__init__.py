"""The fix generators, one module per family, each generator beside the rewrites it makes
(internal: :mod:`auditor._fix._registry` loads them by the names :mod:`auditor._fix._variants`
declares)."""
