"""The engine: applies each project's label log to the core models and writes served state.

``project`` (one project's model, a pure function of its log), ``dyadic`` and ``queue`` (what
it trains and scores beside the nominal model), ``snapshots`` (capture, encode, restore and the
``Snapshotter``), ``loop`` (every project against a store) and ``runtime`` (the loop from the
settings).
"""
