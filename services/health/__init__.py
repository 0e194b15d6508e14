"""The health agent: watches devices, applies the health policy, records and publishes health.

Talks to the other agents only through the health KV bucket and the alerts stream.
"""
