"""Put first on PYTHONPATH, this hides pyarrow from every process of a test
(the producer and its uplink), as on a machine without the ``train`` extra."""

raise ImportError("pyarrow is hidden by the test (tests/data/without_pyarrow)")
