"""`rayslice preview`'s cost per hour: each slice, each VM and the whole stack, at list prices
a person can check against the copied table (tests/fixtures/skypilot-catalog-gcp)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from rayslice import catalog, cli, spec
from rayslice.infra.cost import Cost, render_costs, stack_costs
from rayslice.infra.preview import preview, stack_config

STACKS = Path(__file__).resolve().parents[2] / "infra"


def _row(fixtures_dir, name: str, zone: str) -> dict[str, str]:
    with (fixtures_dir / "skypilot-catalog-gcp" / "vms-rows.csv").open() as f:
        key = "AcceleratorName" if name.startswith("tpu-") else "InstanceType"
        return next(r for r in csv.DictReader(f) if r[key] == name and r["AvailabilityZone"] == zone)


def test_preview_of_the_v6e_16_example_prints_the_tables_price(capsys, fixtures_dir):
    stack = STACKS / "Pulumi.example-v6e-16.yaml"  # tpu-vm, v6e-16, spot, us-east5-b, head VM
    assert cli.main(["preview", "--stack-file", str(stack)]) == 0
    out = capsys.readouterr().out
    slice_price = float(_row(fixtures_dir, "tpu-v6e-16", "us-east5-b")["SpotPrice"])
    head_price = float(_row(fixtures_dir, "n2-standard-16", "us-east5-b")["Price"])
    assert re.search(rf"v6e-16 \(16 chips\), spot, us-east5 +\${slice_price:,.2f}/h\n", out)
    head = rf"VM jax-v6e-16-head: n2-standard-16, on-demand, us-east5 +\${head_price:,.2f}/h\n"
    assert re.search(head, out)
    # The controller's VM (recovery, for Spot) is an e2-small, a type the copied table has no row
    # for: named, and left out of a total that says so.
    assert re.search(r"VM jax-v6e-16-controller: e2-small, on-demand, us-east5 +no published price\n", out)
    total = rf"whole stack +at least \${slice_price + head_price:,.2f}/h "
    assert re.search(total + r"\(1 item\(s\) without a published price\)\n", out)
    assert "read 2026-12-03" in out


def test_every_slice_and_vm_is_priced_and_summed():
    config = stack_config(str(STACKS / "Pulumi.example-multislice.yaml"), [])
    cluster = spec.load_cli(str(STACKS / "Pulumi.example-multislice.yaml"), [])
    costs = stack_costs(cluster, preview(config).registrations)
    slices = [c for c in costs if c.item.startswith("slice ")]
    vms = [c for c in costs if c.item.startswith("VM ")]
    assert cluster.runs_recovery  # so a controller VM beside the head VM
    assert len(slices) == cluster.slices and len(vms) == 2
    assert len(costs) == len(slices) + len(vms)


def test_a_missing_price_is_named_and_left_out_of_the_total():
    text = render_costs([Cost("slice a", 10.0), Cost("slice b", None)])
    assert "slice b  no published price" in text
    assert "at least $10.00/h (1 item(s) without a published price)" in text


def test_tpu7x_has_no_published_price(capsys):
    assert cli.main(["preview", "--stack-file", str(STACKS / "Pulumi.example-compute-tpu7x-16.yaml")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tpu7x-16 \(8 chips\), on-demand, us-central1 +no published price", out)
    assert "(1 item(s) without a published price)" in out


def test_json_output_carries_no_cost_lines(capsys):
    assert (
        cli.main(["preview", "--stack-file", str(STACKS / "Pulumi.example-v6e-4.yaml"), "--output", "json"])
        == 0
    )
    assert "cost per hour" not in capsys.readouterr().out


def test_preview_of_the_gke_flex_start_example_shows_the_flex_pool_and_no_published_price(
    capsys, fixtures_dir
):
    """The pool that waits is in the tree (flexStart, autoscaled from 0), flex-start has no price in
    the source, and the head's CPU pool is priced from the table."""
    stack = STACKS / "Pulumi.example-gke-flex-v6e-16.yaml"
    assert cli.main(["preview", "--stack-file", str(stack)]) == 0
    out = capsys.readouterr().out
    assert '"flexStart": true' in out and '"totalMaxNodeCount": 4' in out and "initialNodeCount: 0" in out
    assert re.search(
        r"slice gke-flex-v6e-16-slice-0: v6e-16 \(16 chips\), flex-start, us-east5 +no published price", out
    )
    head_price = float(_row(fixtures_dir, "n2-standard-16", "us-east5-b")["Price"])
    assert re.search(
        rf"VM gke-flex-v6e-16-head: n2-standard-16, on-demand, us-east5 +\${head_price:,.2f}/h\n", out
    )


def test_a_gke_cluster_the_stack_creates_costs_gkes_management_fee(capsys):
    """D12: GKE pricing, "a flat cluster management fee of $0.10 per cluster per hour"; a zonal
    cluster may be covered by the free tier's monthly credit, which the line says. A cluster the
    stack only adds pools to (gkeCluster) is paid for already: no fee line."""
    stack = str(STACKS / "Pulumi.example-gke-v6e-16.yaml")
    assert cli.main(["preview", "--stack-file", stack]) == 0
    out = capsys.readouterr().out
    fee = re.search(
        r"GKE cluster (\S+): management fee \(GKE pricing\), us-east5-[a-z]; zonal: the "
        r"\$74\.40/month free-tier credit may cover it +\$0\.10/h\n",
        out,
    )
    assert fee, out
    assert cli.main(["preview", "--stack-file", stack, "--set", "gkeCluster=team"]) == 0
    assert "management fee" not in capsys.readouterr().out


def test_an_elastic_cluster_costs_between_no_elastic_slice_and_every_slice(capsys):
    stack = STACKS / "Pulumi.example-compute-elastic-v6e-16.yaml"  # 0 to 2 on-demand v6e-16 slices
    assert cli.main(["preview", "--stack-file", str(stack)]) == 0
    out = capsys.readouterr().out
    cluster = spec.load_cli(str(stack), [])
    slice_price = catalog.slice_hour_price(cluster.tpu, "us-east5", "on-demand")
    head = float(re.search(r"VM jax-elastic-v6e-16-head: .* \$([0-9.]+)/h\n", out)[1])
    assert out.count(", elastic, us-east5") == 2
    assert re.search(rf"whole stack, no elastic slice +at least \${head:,.2f}/h ", out)
    assert re.search(rf"whole stack, every slice +at least \${head + 2 * slice_price:,.2f}/h ", out)
    assert "\n  whole stack  " not in out
