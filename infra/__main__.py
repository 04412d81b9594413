"""The Pulumi program of this repository's project (`Pulumi.yaml`: ``main: infra/``).

Pulumi runs this directory with `runpy`, which puts ``infra/`` first on `sys.path`. Only this
file lives here, so no module of the package can be imported a second time under a top-level
name (``cluster``, ``network`` ...); the program itself is `rayslice.infra.program.main`, which
`rayslice preview` and the tests run too. The stack files beside it are the project's stacks
(`Pulumi.yaml`: ``stackConfigDir: infra/``).
"""

from rayslice.infra.program import main

main()
