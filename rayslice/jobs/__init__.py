"""Ray jobs from the client's side: what `rayslice run` submits, where, and how it follows them.

The jobs themselves (`rayslice.workloads`) run on cluster hosts and never import this package;
this package runs on the user's machine and ships them (`upload`), finds the cluster and its
token (`connection`), refuses a bundled job the cluster cannot run before uploading it
(`preflight`), submits and streams a job (`submit`), and tells a node's death from a job's own
failure to restart it (`restarts`). `commands` is the `rayslice run` command line.
"""
