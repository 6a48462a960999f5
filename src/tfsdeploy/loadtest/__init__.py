"""The load generator for TFServing fleets (ghz-compatible reports) and capacity planning.

Modules: ``payloads`` (request data; the messages come from ``core.tfsapi``, without
TensorFlow),
``schedule`` (rates and concurrency over time), ``engine`` (the per-process loop),
``parallel`` (worker processes), ``stats`` (histograms and exact merging), ``report``,
``gates``, ``sweep``, ``capacity`` (instances for a target QPS), ``cli``; ``fakeserver`` is test
equipment.
"""
