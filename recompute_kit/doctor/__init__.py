"""The doctor: symptom -> cause -> confirm -> fix, from real training artefacts.

`evidence/` parses logs, OOM messages, tracebacks, configs, experiment tables and memory dumps
into an `Evidence` (one module per format); `rules/` is the rule catalog (one module per family
of categories, each rule an id, a doc and a check); `types.py` holds what both share;
`engine.py` runs the rules over all the evidence together and ranks what it finds.
"""
