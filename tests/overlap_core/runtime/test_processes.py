"""Ports for a job's servers: free now, and out of the kernel's way."""

import socket

from overlap_core.runtime import processes


def test_ports_are_drawn_below_the_range_the_kernel_hands_out():
  ephemeral = (32768, 60999)
  ports = processes.free_ports(8, ephemeral=ephemeral)
  assert len(set(ports)) == 8
  # Below the range, so no outgoing connection can take one before the
  # server binds it.
  assert all(ephemeral[0] - processes.PICK_SPAN <= p < ephemeral[0]
             for p in ports)


def test_a_port_something_is_bound_to_is_not_free():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    # Held on one address, it is not free on all of them.
    assert not processes.nothing_bound_to(taken)


def test_where_the_range_is_too_low_to_draw_below_the_kernel_picks():
  ports = processes.free_ports(3, ephemeral=(2000, 60999))
  assert len(set(ports)) == 3
  # The kernel's own picks lie in its range, where it says one.
  ephemeral = processes.ephemeral_port_range()
  if ephemeral:
    assert all(ephemeral[0] <= p <= ephemeral[1] for p in ports)


def test_the_range_is_read_from_where_linux_keeps_it(tmp_path):
  path = tmp_path / "ip_local_port_range"
  path.write_text("32768\t60999\n", encoding="ascii")
  assert processes.ephemeral_port_range(str(path)) == (32768, 60999)
  assert processes.ephemeral_port_range(str(tmp_path / "none")) is None
