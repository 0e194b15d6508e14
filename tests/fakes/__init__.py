"""Test doubles behind the seams of the production code (fakes, not mocks)."""
