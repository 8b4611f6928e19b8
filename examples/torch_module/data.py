"""The data: a map-style torch Dataset that draws its images.

Each image is noise with one bright square whose position tells its
class. An example is made from a generator seeded by its index, so any
worker can make any example, in any order, the same on every run.
"""

import torch

NUM_EXAMPLES = {"train": 2048, "eval": 256}


class Squares(torch.utils.data.Dataset):
  """(image [3, S, S] float32, label) pairs; `len()` examples."""

  def __init__(self, num_examples: int, image_size: int, num_classes: int,
               seed: int):
    self.num_examples = num_examples
    self.image_size = image_size
    self.num_classes = num_classes
    self.seed = seed
    self.square = max(2, image_size // 4)
    self.stride = max(1, (image_size - self.square) // max(1, num_classes - 1))

  def __len__(self):
    return self.num_examples

  def __getitem__(self, index):
    label = index % self.num_classes
    generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
    image = 0.5 * torch.rand(3, self.image_size, self.image_size,
                             generator=generator)
    corner = min(label * self.stride, self.image_size - self.square)
    image[:, corner:corner + self.square, corner:corner + self.square] += 0.5
    return image, label


def load(split, image_size, num_classes):
  """The trainer calls this once per split; it shards, shuffles, batches
  and prefetches what it returns."""
  return Squares(NUM_EXAMPLES[split], image_size, num_classes,
                 seed=0 if split == "train" else 1)
