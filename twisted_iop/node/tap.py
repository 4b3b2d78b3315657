"""``twistd iop-node``: options and service composition of the Node runtime."""

from __future__ import annotations

import os
from typing import Any, Optional, cast

from twisted.application.internet import ClientService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IProtocolFactory
from twisted.python import usage

from twisted_iop.configuration import ConfigError
from twisted_iop.node.config import NodeRuntimeConfig, load_node_config
from twisted_iop.node.edge_link import EdgeLink
from twisted_iop.node.inference import InferenceHTTPClient, InferenceRunner
from twisted_iop.node.probes import HTTPClient, ProviderProber
from twisted_iop.node.runtime import NodeRuntime


class Options(usage.Options):
    """Command line of ``twistd iop-node``."""

    optParameters = [
        ["config", "c", None, "Path to node.yaml (see configs/node.yaml)."],
    ]

    def postOptions(self) -> None:
        """Parse node.yaml now so a bad config is a usage error, not a traceback."""
        if not self["config"]:
            raise usage.UsageError("--config PATH is required (see configs/node.yaml)")
        try:
            self["node_config"] = load_node_config(self["config"], os.environ)
        except ConfigError as e:
            raise usage.UsageError(f"bad node config: {e}") from None


class NodeService(MultiService):
    """The Node's services, with handles on the runtime and the Edge link."""

    def __init__(self, config: NodeRuntimeConfig, runtime: NodeRuntime, link: EdgeLink, edge: ClientService) -> None:
        super().__init__()
        self.config = config
        self.runtime = runtime
        self.link = link
        self.edge = edge

    def stopService(self) -> Deferred[None] | None:
        self.link.stop()
        return cast("Deferred[None] | None", super().stopService())


def makeService(options: Any, reactor: Any = None, http: Optional[HTTPClient] = None) -> NodeService:
    """Compose the Node: the runtime first, then the Edge link."""
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        reactor = default_reactor
    config: NodeRuntimeConfig = (
        options["node_config"] if "node_config" in options else load_node_config(options["config"])
    )
    clock: Any = reactor
    runtime = NodeRuntime(config, clock, ProviderProber(clock, http))
    runtime.inference = InferenceRunner(lambda: runtime.providers, clock, cast(Optional[InferenceHTTPClient], http))
    link = EdgeLink(config, runtime, clock)
    endpoint = clientFromString(reactor, config.edge.address)
    edge = ClientService(endpoint, cast(IProtocolFactory, link.factory()), retryPolicy=link.retry_delay, clock=clock)
    edge.setName("edge-link")
    service = NodeService(config, runtime, link, edge)
    runtime.setServiceParent(service)
    edge.setServiceParent(service)
    return service
