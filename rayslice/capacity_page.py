"""docs/capacity-table.md, rendered from `rayslice.capacity_table` and the catalog's flex-start
zones: every cell with its calls, events, sources and unsettled points.

Only renders: ``scripts/write_capacity_table.py`` writes the page, and
tests/rayslice/test_capacity_page.py fails while the page differs from `render()`.
"""

from __future__ import annotations

from rayslice import capacity_table, catalog
from rayslice.capacity_table import Cell, Source, Unsettled, Wait

PAGE = "docs/capacity-table.md"
_HEADER = f"""<!-- Generated from rayslice/capacity_table.py and rayslice/catalog.py by
scripts/write_capacity_table.py; do not edit by hand. Remake it with:
python scripts/write_capacity_table.py -->

# Capacity table

One cell per platform and capacity: how rayslice creates a slice there, who brings a failed
slice back, what each event means and what rayslice's recovery controller does about it. Every
cell names its sources; where they disagree or say nothing, the cell says so and holds the
choice that is safe under each reading. Each cell also says, per state a slice can stay in
(waiting for capacity, partly created, being repaired, preempted, ended), how long the recovery
controller lets it last before it acts, and what the state costs meanwhile. [Getting
capacity](capacity.md) explains the choices; `rayslice validate` and `rayslice preview` print
the stack's own cell.

A stack's cell comes from its keys: `platform`, `capacity`, `queued` (tpu-vm), and for
`capacity: reserved` whether `reservation` names one, whether `calendarMode` is set and
`capacityMode` (`reserved` names one, `reserved-any` takes any matching reservation,
`reserved-calendar` is a future reservation created in calendar mode, `reserved-all-capacity` a
reservation in All Capacity mode). Placeholders in the fields: `{capacity_table.HOSTS}`
the slice's host count, `{capacity_table.RESERVATION_NAME}` the reservation's name,
`{capacity_table.MAX_RUN_SECONDS}` `maxRunHours` in seconds, `{capacity_table.PROJECT}` and
`{capacity_table.ZONE}` the stack's.
"""


def _cell_summary_row(cell: Cell) -> str:
    grace = f"{cell.repair_grace_s // 60} min" if cell.repair_grace_s is not None else "—"
    parts = [
        f"[{cell.key}](#{_anchor(cell)})",
        cell.provisioning_model or "—",
        cell.mig_mode or "—",
        cell.failure_action or "—",
        cell.repaired_by,
        grace,
        "yes" if cell.elastic_allowed else "no",
        cell.price_key,
    ]
    return "| " + " | ".join(parts) + " |"


def _anchor(cell: Cell) -> str:
    return cell.key.replace("/", "")


def _section(cell: Cell, sources: list[Source], unsettled: list[Unsettled]) -> list[str]:
    lines = [
        f'<a id="{_anchor(cell)}"></a>',
        f"## {cell.key}",
        "",
        cell.summary[0].upper() + cell.summary[1:] + ".",
        "",
    ]
    lines.append("Calls that create a slice, in order:")
    lines.append("")
    for number, call in enumerate(cell.calls, 1):
        fields = call.fields()
        shown = "; ".join(f"`{path}` = `{value}`" for path, value in fields.items()) or "no capacity field"
        lines.append(f"{number}. `{call.method}`: {shown}")
    lines.append("")
    if cell.target_size:
        lines += [f"Hosts: {cell.target_size}.", ""]
    lines += ["| event | what it means | the controller |", "|---|---|---|"]
    lines += [f"| {event} | {r.meaning} | {r.action} |" for event, r in cell.events.items()]
    lines += ["", "| state | how long before rayslice acts | then | what it costs meanwhile |"]
    lines.append("|---|---|---|---|")
    lines += [f"| {w.state} | {_limit(w)} | {w.then} | {w.cost} |" for w in cell.waits]
    lines += [
        "",
        "Sources: " + ", ".join(f"[{s.title}](#source-{sources.index(s) + 1})" for s in cell.sources) + ".",
    ]
    if cell.unsettled:
        lines += [
            "",
            "Unsettled: "
            + ", ".join(
                f"[{unsettled.index(u) + 1}](#unsettled-{unsettled.index(u) + 1})" for u in cell.unsettled
            )
            + ".",
        ]
    lines.append("")
    return lines


def _limit(wait: Wait) -> str:
    if wait.limit_s is None:
        return "no limit"
    return "at once" if wait.limit_s == 0 else f"{wait.limit_s // 60} min"


def _sources(sources: list[Source]) -> list[str]:
    lines = ["## Sources", ""]
    for number, source in enumerate(sources, 1):
        where = f" (<{source.url}>)" if source.url else " (no public address recorded)"
        lines.append(f'{number}. <a id="source-{number}"></a>{source.title}{where}: {source.says}')
    return [*lines, ""]


def _unsettled(unsettled: list[Unsettled]) -> list[str]:
    lines = ["## Unsettled points", ""]
    for number, point in enumerate(unsettled, 1):
        lines.append(f'{number}. <a id="unsettled-{number}"></a>{point.point} Choice: {point.choice}')
    return [*lines, ""]


def _flex_zones() -> list[str]:
    lines = [
        "## Flex-start zones",
        "",
        "Where each platform takes flex-start, per generation (`catalog.FLEX_START_ZONES`, whose "
        "comment names each source); `rayslice validate` refuses other zones and names these.",
        "",
        "| platform | generation | zones |",
        "|---|---|---|",
    ]
    for platform, generations in catalog.FLEX_START_ZONES.items():
        for generation, zones in generations.items():
            shown = ", ".join(zones) if zones is not None else "any zone of the generation (not checked)"
            lines.append(f"| {platform} | {generation} | {shown} |")
    return [*lines, ""]


def render() -> str:
    """The whole page."""
    lines = [
        _HEADER,
        "| cell | provisioning model | MIG mode | on a failed host | repaired by | controller waits "
        "| minSlices | price key |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_cell_summary_row(c) for c in capacity_table.CELLS]
    lines.append("")
    lines += _flex_zones()
    sources = list(dict.fromkeys(s for c in capacity_table.CELLS for s in c.sources))
    unsettled = list(dict.fromkeys(u for c in capacity_table.CELLS for u in c.unsettled))
    for cell in capacity_table.CELLS:
        lines += _section(cell, sources, unsettled)
    lines += _unsettled(unsettled)
    lines += _sources(sources)
    return "\n".join(lines).rstrip() + "\n"
