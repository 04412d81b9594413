"""Google's documented rules for the Compute Engine and TPU resources a Pulumi program declares.

`bodies` turns Pulumi resource inputs into the REST requests the Google provider sends; `rules`
checks them against Google's documented rules, each with its source. `rayslice preview` and the
Pulumi policy pack in ``policy/`` both run them: one definition of each rule, two runners.
Core-level: imports only `rayslice.catalog` and `rayslice.errors` from rayslice.
"""
