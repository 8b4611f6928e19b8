"""Offload flags: which tensors leave the device between uses, and how."""

from absl import flags

# What --offload may name; "none" alone turns offload off.
OFFLOAD_TARGETS = ("activations", "parameters")


def define_flags():
  flags.DEFINE_list(
      "offload", ["none"],
      "none, or a comma-separated list of: activations (tensors the "
      "model's forward saves for backward are copied to host memory in "
      "forward and back in backward), parameters (PyTorch only: each "
      "layer's weights live on the host and come to the device for its "
      "forward and its backward; gradients, the optimizer step and its "
      "state stay on the host: optimizer state leaves the device with "
      "parameters only). On a host without a GPU the copies go CPU to "
      "CPU: the mechanics run, no memory is saved.")
  flags.DEFINE_boolean(
      "offload_pin_memory", False,
      "Offloaded tensors live in pinned (page-locked) host memory, which "
      "the GPU copies to and from directly (PyTorch only).")
  flags.DEFINE_boolean(
      "offload_non_blocking", False,
      "Issue the copies asynchronously (non_blocking=True); into pageable "
      "memory CUDA still makes the host wait for a device-to-host copy "
      "(PyTorch only).")
  flags.DEFINE_boolean(
      "offload_prefetch", False,
      "Copy the next layer's offloaded tensors back to the device on a side "
      "stream while the current layer computes (PyTorch only; needs "
      "--offload_non_blocking).")
