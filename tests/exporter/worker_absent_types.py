"""What a model author's library registers and aotid's compile worker does
not have: a pytree type and an operator (self_check_test.py)."""
import torch
import torch.utils._pytree as pytree


class Pair:
    def __init__(self, scores, hidden):
        self.scores, self.hidden = scores, hidden


pytree.register_pytree_node(Pair, lambda p: ([p.scores, p.hidden], ["scores", "hidden"]),
                            lambda values, context: Pair(*values),
                            serialized_type_name="worker_absent_types.Pair")


@torch.library.custom_op("aotid_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)
