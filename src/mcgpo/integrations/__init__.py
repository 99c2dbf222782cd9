"""Adapters that run mcgpo inside other training engines (optional extras).

Nothing in mcgpo imports this package; each adapter imports its engine (``verl``) and the
mcgpo layers below it. See docs/integrations/.
"""
