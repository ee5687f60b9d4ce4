"""The hand-written cases of ``contracts/tools/make_fixtures.py``, one module per group.

- :mod:`.common` -- sizes, digests, the feature list and the ``case`` override helper;
- :mod:`.value_cases` -- the contract value types and the state handle variants;
- :mod:`.wire_cases` -- the wire value types, feature negotiation and dtype names;
- :mod:`.json_frames` -- frames with a JSON header;
- :mod:`.binary_frames` -- frames with the fixed binary header.

Nothing here imports the implementation the fixtures test.
"""
