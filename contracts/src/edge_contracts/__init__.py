"""edge-contracts: value types, wire framing and conformance fixtures (stdlib only).

Importing this package, or any submodule except :mod:`edge_contracts.tensors`, uses
the standard library only, so a bare vendor interpreter can import it from a staged
directory. The submodules:

- :mod:`~edge_contracts.errors` -- ``ContractError`` and its typed subclasses.
- :mod:`~edge_contracts.error_copies` -- ``whole_reduction``: how an error copies whole.
- :mod:`~edge_contracts.dtypes` -- ``DType``, the one spelling of every element type.
- :mod:`~edge_contracts.protocol` -- ``PROTOCOL_VERSION``, features, ``negotiate``.
- :mod:`~edge_contracts.buffers` -- ``BufferDescriptor``, memory domains, layouts.
- :mod:`~edge_contracts.requests` -- ``StageRequest``, ``StageEvent`` and friends.
- :mod:`~edge_contracts.state` -- ``StateHandle``.
- :mod:`~edge_contracts.devices` -- ``DeviceDescriptor`` and memory pool names.
- :mod:`~edge_contracts.manifest` -- ``ArtifactManifest`` (data and syntax only).
- :mod:`~edge_contracts.headers` / :mod:`~edge_contracts.wire` -- frame headers and
  length-prefixed framing.
- :mod:`~edge_contracts.tensors` -- NumPy arrays to and from frames (needs numpy).
- :mod:`~edge_contracts.conformance` -- the language-independent fixtures and their
  runner (``python -m edge_contracts.conformance``).
"""

__version__ = "0.1.0"
