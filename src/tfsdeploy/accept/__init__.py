"""The fleet acceptance run (``fab accept``): the acceptance table measured against a model's
stable ports, with open-loop load from one or several generator hosts and, optionally, a
release rolled out in the middle of the window.

Pure modules: ``options`` (what was asked, with `fab accept`'s defaults), ``plan`` (options ->
what to run), ``commands`` (argument lists run on the generator hosts), ``merge`` (exact
merging of every generator's results), ``rows`` (the table and the exit code), ``report``
(JSON and text), ``plot`` (PNG). Effects: ``bundle`` (the
generator environment), ``loadgen`` (generator hosts over SSH or on this machine),
``release`` (the ``fab deploy`` subprocess), ``run`` (the whole run).
"""
