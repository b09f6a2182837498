"""The demo-corpus builder behind scripts/demo_corpus.py (standard library only)."""
