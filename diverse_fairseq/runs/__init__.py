"""What a run is: its settings, plan and identity, its dataset, its checkpoints and their scoring
(docs/architecture.md, "What a run is, planned once")."""
