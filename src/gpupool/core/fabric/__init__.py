"""The InfiniBand fabric model (pure): parse, generate, route, price, partition and apply QoS.

Entry points: `parse.parse_topology(text)` -> `model.Fabric`; `generate.fat_tree` /
`generate.rail_optimized`; `forwarding.compute_tables(fabric)`; `paths.route(fabric, a, b)`;
`analysis.fail_link` / `analysis.bisection_bandwidth`; `qos.plan_qos`;
`partitions.plan_partitions`; `collective.score_placement`; `telemetry.port_load` / `apply_loads`.
"""
