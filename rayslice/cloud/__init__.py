"""Google's documented rules for the Compute Engine and TPU resources a Pulumi program declares,
the twin that keeps them, and the REST plumbing rayslice's API clients share.

`bodies` turns Pulumi resource inputs into the REST requests the Google provider sends; `rules`
checks them against Google's documented rules, each with its source. `rayslice preview` and the
Pulumi policy pack in ``policy/`` both run them: one definition of each rule, two runners.
`twin` emulates the three APIs (one module each) on one state; `states` holds Google's state
names; `rest` is the session, base URLs, error mapping and operation polling of the client that
the recovery controller, `rayslice status` and the providers share (`rayslice.recovery.cloud`).
Core-level: imports only `rayslice.catalog`, `rayslice.errors` and the other core modules
`tests/rayslice/test_imports.py` allows.
"""
