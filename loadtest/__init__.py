"""The load test: ``python -m loadtest.run`` drives a gateway with locust (``loadtest/locustfile.py``)."""
