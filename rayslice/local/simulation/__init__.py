"""One simulated cluster, on top of the host machinery and the fakes of Google: the plan and its
state file (`state`); `Simulation` (`simulator`: create, open, destroy), made of the parts it
inherits: `recorded` (the loaded state and its recorded processes), `services` (the metadata
servers and the cloud API emulation), `power` (boot, power off, run inside a host) and
`progress` (what hosts report); the wiring of the cloud API emulation to the hosts
(`cloud_bridge`) and ``rayslice local status`` (`status`)."""
