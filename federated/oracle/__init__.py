"""Oracle analyses computed on a round's client models (Chen et al., ICLR 2023, §6.2): convex combinations
of models (:mod:`.combine`, on :func:`federated.aggregate.weighted_average`'s one buffer rule), the optimal
convex aggregation search (:mod:`.convex`), the evaluation of a combined model (:mod:`.evaluate`), and the
per-round tracking inside ``federate`` (:mod:`.tracking`). ``analysis`` only draws what they return."""
