"""Leaks files from a named function, for the Python frame tests.

Usage: python3 leak.py RATE SECONDS [thread]

Prints "ready" once running, then opens this file RATE times a second from
cache_tokenizer and never closes what it opened, for SECONDS. With
"thread", a worker thread leaks while the main thread keeps the
interpreter busy. The tests find the leaking line by its "leak:" comment.
"""
import sys
import threading
import time


def cache_tokenizer(path, cache):
    cache.append(open(path, "rb"))  # leak: open


def serve(rate, end):
    cache = []
    while time.monotonic() < end:
        cache_tokenizer(__file__, cache)
        time.sleep(1 / rate)


def spin(end):
    n = 0
    while time.monotonic() < end:
        n += sum(range(1000))
    return n


def main():
    rate, seconds = float(sys.argv[1]), float(sys.argv[2])
    end = time.monotonic() + seconds
    print("ready", flush=True)
    if sys.argv[3:] == ["thread"]:
        worker = threading.Thread(target=serve, args=(rate, end), name="worker")
        worker.start()
        spin(end)
        worker.join()
    else:
        serve(rate, end)


if __name__ == "__main__":
    main()
