"""Vendor device models shared by every agent: one package per vendor, one registry."""
