"""Suffix automaton over a request's tokens: the continuation of the longest repeated suffix."""

from __future__ import annotations


class SuffixIndex:
    """Online suffix automaton; ``append`` is amortised O(1).

    ``continuation(n)`` finds the longest suffix of the text that also ends earlier in it and
    returns up to ``n`` tokens that followed its first earlier occurrence.
    """

    def __init__(self) -> None:
        self.text: list[int] = []
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._length: list[int] = [0]
        self._first_end: list[int] = [-1]  # end index of the first occurrence of each state
        self._last = 0

    def __len__(self) -> int:
        return len(self.text)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        nxt, link, length, first_end = self._next, self._link, self._length, self._first_end
        pos = len(self.text)
        self.text.append(token)
        cur = len(nxt)
        nxt.append({})
        length.append(length[self._last] + 1)
        link.append(0)
        first_end.append(pos)
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                length.append(length[p] + 1)
                link.append(link[q])
                first_end.append(first_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self._last = cur

    def longest_repeat(self) -> tuple[int, int]:
        """(length, end index of its first occurrence) of the longest suffix that ends
        earlier too; (0, -1) if none."""
        state = self._link[self._last] if self._last else -1
        if state <= 0:
            return 0, -1
        return self._length[state], self._first_end[state]

    def continuation(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the longest repeated suffix."""
        length, end = self.longest_repeat()
        if length == 0 or max_tokens <= 0:
            return []
        return self.text[end + 1 : end + 1 + max_tokens]
