"""The Node daemon (``twistd iop-node``): runs one machine's inference engines for its Edge.

* :mod:`.engines`: talking to engines (one adapter per kind, the HTTP client, the stream
  reader, health probes and load readings);
* :mod:`.launch`: the engines the Node starts and supervises itself;
* :mod:`.deployments`: engine profiles and the instances deployments ask for;
* beside them: the link to the Edge, the inference runner, metrics, config, the runtime
  and the tap.
"""
