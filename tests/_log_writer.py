"""Helper for tests/test_log.py: append decisions forever, printing each id once acknowledged.

Usage: python tests/_log_writer.py DB_PATH

Each line on stdout is a decision id whose ``DecisionLog.append`` has returned, i.e. whose
write the log acknowledged. The parent test kills this process with SIGKILL at a random
point and checks that every printed id is in the database.
"""

from __future__ import annotations

import math
import sys

from spotstop.guard._log import DecisionLog, DecisionRecord


def main(path: str) -> None:
    with DecisionLog(path) as log:
        i = 0
        while True:
            record = DecisionRecord(
                request=f"crash-test request {i}",
                member_scores={"a": float(i), "b": math.nan},
                fused_score=0.1 * i,
                threshold=0.0,
                policy="frozen",
                label="SAFE",
                fail_closed=False,
                latency_ms={"total": 1.0},
                bundle_id="bundle-crash",
                prompt_hash="p0",
            )
            log.append(record)
            sys.stdout.write(record.decision_id + "\n")
            sys.stdout.flush()
            i += 1


if __name__ == "__main__":
    main(sys.argv[1])
