"""The doctor: symptom -> cause -> confirm -> fix, from real training artefacts.

`evidence.py` parses logs, configs, experiment tables and memory dumps into an `Evidence`;
`rules.py` is the rule catalog (each rule an id, a doc and a check); `engine.py` runs the rules
over all the evidence together and ranks what it finds.
"""
