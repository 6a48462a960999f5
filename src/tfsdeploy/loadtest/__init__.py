"""Load generator and acceptance tool for TFServing fleets (ghz-compatible reports).

Modules: ``protos`` (request messages without TensorFlow), ``payloads`` (request data),
``schedule`` (rates and concurrency over time), ``engine`` (the per-process loop),
``parallel`` (worker processes), ``stats`` (histograms and exact merging), ``report``,
``gates``, ``sweep``, ``cli``; ``fakeserver`` is test equipment.
"""
