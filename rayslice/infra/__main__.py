"""Entry point of the Pulumi project (Pulumi.yaml: ``main: rayslice/infra/``)."""

from rayslice.infra.program import main

main()
