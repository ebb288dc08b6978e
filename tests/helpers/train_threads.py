"""Runs examples/fsdp_train.py's main() in this rank, then prints the names of the threads still
running ("threads after main: [...]", to stderr) and exits with main's status. A thread alive
here is alive while the interpreter finalizes, where a C++ one that takes the GIL aborts."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import fsdp_train  # noqa: E402

rc = fsdp_train.main(sys.argv[1:])
tasks = os.listdir("/proc/self/task")
names = sorted(open(f"/proc/self/task/{t}/comm", encoding="utf-8").read().strip() for t in tasks)
# one write of one line: the ranks share the pipe, and print()'s separate writes of its pieces
# interleaved two ranks' lines (seen once in CI: "threads after main:threads after main: [...]")
os.write(2, f"threads after main: {names}\n".encode())
sys.exit(rc)
