"""The Pulumi program of the host-image project (`infra-image/Pulumi.yaml`).

The program is `rayslice.infra.image.main`, which `rayslice image preview` and the tests run
too; this directory holds nothing else Pulumi's `runpy` could import under a top-level name.
"""

from rayslice.infra.image import main

main()
