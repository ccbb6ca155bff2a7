"""The engine: a case through an implementation and the float64 truth to a verdict (``verify``),
a law's examples drawn through the op cards (``examples``), the laws themselves (``laws``), compile
buckets (``buckets``), the seeded grid (``grid``) and the reproducers every failure prints
(``reproduce``)."""
