"""BENCHMARKS.md table of the checkpoint soak (section 12).

Registered into `render_tables.TABLES` on import, like the tables there.
The soak is a correctness campaign, not a timing: its figures are counts
(kills, failed verifications, checkpoints lost), so the host's load only
changes how long it took, which the table shows beside them.
"""

from benchmarks.render_tables import DASH, g, load, markdown, table

# One results file per framework: each ran as its own soak process.
SOAK_FILES = (("checkpoint_soak_tensorflow", "tensorflow"),
              ("checkpoint_soak_pytorch", "pytorch"))


@table("checkpoint_soak")
def checkpoint_soak() -> str:
  rows = []
  for name, framework in SOAK_FILES:
    data = load(name)
    result = data["frameworks"][framework]
    config = data["config"]
    rows.append([
        framework, g(result["kills"]),
        g(result["kills_by_trigger"]["persist"]), g(result["lives"]),
        g(result["campaigns"]), "/".join(str(k) for k in config["keep"]),
        g(result["corruptions"]), g(result["reruns_after_finish"]),
        g(result["failed_verifications"]), g(result["checkpoints_lost"]),
        f"{result['digest_matches']} of "
        f"{result['digest_matches'] + result['digest_mismatches']}",
        g(len(result["problems"])),
        f"{result['wall_s'] / 60:.0f}",
        " / ".join(f"{v:.1f}" for v in data["load_average_before"][:1]
                   + data["load_average_after"][:1]) or DASH])
  return markdown(
      ["framework", "SIGKILLs", "of them during a persist", "lives",
       "campaigns", "keep", "newest corrupted", "reruns after finish",
       "loads that failed to verify", "checkpoints lost against retention",
       "resumed digest = uninterrupted", "problems", "wall minutes",
       "load average before / after"], rows)
