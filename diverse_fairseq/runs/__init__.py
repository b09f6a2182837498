"""What a run is: its settings, its plan and identity, the dataset it reads, where it saves, which checkpoint
is evaluated and how it is scored.

See docs/architecture.md ("What a run is, planned once")."""
