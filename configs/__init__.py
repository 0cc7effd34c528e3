"""Data shipped with coterie: the demo personas (installed as ``coterie.configs``)."""
