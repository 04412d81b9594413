"""One simulated cluster, on top of the host machinery and the fakes of Google: the plan and its
state file (`state`), `Simulation` (split by responsibility: `simulator` builds and removes,
`power` boots and powers off, `services` runs the metadata servers and the cloud API emulation,
`progress` reads what hosts report), the wiring of the cloud API emulation to the hosts
(`cloud_bridge`) and `rayslice local status` (`status`)."""
