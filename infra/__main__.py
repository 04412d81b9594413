"""Entry point of the Pulumi project (Pulumi.yaml: ``main: infra/``)."""

from rayslice.infra.program import main

main()
