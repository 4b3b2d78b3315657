"""The test kit: test doubles, frame codecs and daemon harnesses, written once.

Like ``twisted.internet.testing`` and ``treq.testing``, it ships in the
package so the tests and ``bench/`` share one copy. Production code never
imports it. The modules:

* :mod:`twisted_iop.testing.wires.frames`: frames and protobuf fields by hand, and
  the one decoder of a length-prefixed frame stream;
* :mod:`twisted_iop.testing.configs`: control-plane, edge and node
  configurations for tests (loopback listeners on port 0, fast reconnects);
* :mod:`twisted_iop.testing.wires.peers`: the scripted Edge (:class:`ScriptedEdge`),
  a scripted Control Plane and Node, and typed fakes of ``EdgePeer`` and
  ``NodePeer`` that mypy checks against the real Protocols;
* :mod:`twisted_iop.testing.harness`: a real Control Plane, Edge and Node in
  this reactor, daemons as ``twistd`` processes, bounded polling
  (:func:`eventually`) and a self-signed certificate;
* :mod:`twisted_iop.testing.http`: a raw HTTP/1.1 client that misbehaves on
  purpose, and the inference gateway's request and event-stream helpers;
* :mod:`twisted_iop.testing.wires.wire`: drivers of every wire's accepting side
  without sockets, for the fuzz tests and ``bench/wire_fuzz.py``;
* :mod:`twisted_iop.testing.json_reference`: the plain dict renderings the
  Control Plane's views written as bytes must equal;
* :mod:`twisted_iop.testing.engines.tiny_model`: a tiny llama GGUF with random
  weights on llama.cpp's vocabulary, for running a real engine;
* :mod:`twisted_iop.testing.engines.llama_engine`: llama-cpp-python's OpenAI server
  as a child process, and a Control Plane, Edge and Nodes in front of it.
* :mod:`twisted_iop.testing.history`: capacity history's chunks as an earlier
  release stored them (before the latency fields), for the reading tests;
* :mod:`twisted_iop.testing.engines.launch`: node.yaml entries whose engine the Node
  launches (``iop-mock-provider`` or a misbehaving script), an engine
  supervisor with what it reported recorded, a chat load generator and
  ``/proc`` helpers (processes by command line, a process group's members).

Nothing here imports pytest; the test-only libraries (``cryptography``,
``jsonschema``, ``gguf``, ``openai``) are imported where they are used.
This package imports nothing by itself: :mod:`harness`, :mod:`peers`,
:mod:`http`, :mod:`launch` and :mod:`llama_engine` use the global reactor, :mod:`frames`,
:mod:`configs`, :mod:`wire` and :mod:`tiny_model` do not.
"""
