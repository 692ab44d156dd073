"""RadixCache: a token tree whose nodes hold KV blocks, so requests sharing a prefix reuse its K/V.

Each node owns an edge of token ids covering absolute positions `[start, end)` from the root, and holds one
reference on every block that overlaps that range (block indices `start // block_size .. (end - 1) // block_size`).
A block at a branch point can overlap a parent and a child: both hold a reference. For a path, the block of index
`i` is the one of the deepest node overlapping `i`: a child that starts inside a block carries its own copy of the
parent's tokens in that block, so reading the child's block is right whether the match stops in the parent or goes
on into the child.

Lock references protect the nodes running requests use (a lock on a node counts on every ancestor); eviction takes
least-recently-used unlocked leaves. They come from a heap kept as the tree changes, with an entry pushed whenever a
node may have become an evictable leaf (touched, unlocked, or left childless by an eviction) and stale entries
skipped when popped, so an eviction costs O(log n) per leaf instead of a walk over the whole tree. Pure Python, no
torch.

Namespaces: the same tokens computed under two LoRA adapters have different K/V, so each namespace (a request's
`lora_id`; 0 is the base model) has a root of its own and lookups never cross from one to another. Eviction is
one LRU order over all of them; `remove_namespace` drops an unloaded adapter's whole tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from radixlm.core.block_pool import BlockPool, cdiv
from radixlm.core.radix_node import PrefixMatch, RadixNode, common_prefix_len


class RadixCache:
    """Token tree over the block pool; see the module docstring for the block layout."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.root = RadixNode([], 0, [], None)  # namespace 0's: the base model
        self.root.lock_ref = 1  # never evicted
        self._roots: dict[int, RadixNode] = {0: self.root}
        self._namespaces: dict[int, int] = {id(self.root): 0}  # id(root) -> its namespace
        # Called with each leaf `evict` is about to drop, while its blocks are still its own (the host tier's hook).
        self.on_evict: Callable[[RadixNode], None] | None = None
        self._clock = itertools.count(1)
        self.num_evicted_blocks = 0
        self.num_nodes = 0  # below the root
        self.num_tokens = 0  # on all edges
        # (last_access, push order, node): every unlocked leaf has an entry with its current last_access; entries
        # whose node has since been touched, locked, given children or evicted are stale (see `_is_evictable`).
        self._evictable: list[tuple[int, int, RadixNode]] = []
        self._pushes = itertools.count()

    # -- lookups -----------------------------------------------------------------------------------------------
    def match_prefix(self, token_ids: list[int], namespace: int = 0) -> PrefixMatch:
        """Longest cached prefix of `token_ids` in `namespace`; splits the last node so the match ends on a node
        boundary."""
        node, matched = self._walk(token_ids, split=True, namespace=namespace)
        self._touch(node)
        return PrefixMatch(matched, self._path_blocks(node, matched), node)

    def match_length(self, token_ids: list[int], namespace: int = 0) -> int:
        """Length of the longest cached prefix, without changing the tree or its LRU order."""
        return self._walk(token_ids, split=False, namespace=namespace)[1]

    def _root(self, namespace: int) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode([], 0, [], None)
            root.lock_ref = 1
            self._namespaces[id(root)] = namespace
        return root

    def _walk(self, token_ids: list[int], split: bool, namespace: int = 0) -> tuple[RadixNode, int]:
        found = self._root(namespace) if split else self._roots.get(namespace)
        if found is None:  # nothing cached under this namespace (a lookup does not create its root)
            return self.root, 0
        node, matched = found, 0
        while matched < len(token_ids):
            child = node.children.get(token_ids[matched])
            if child is None:
                break
            common = common_prefix_len(child.token_ids, token_ids, matched)
            matched += common
            if common < len(child.token_ids):
                if split:
                    node = self._split(child, common)
                break
            node = child
        return node, matched

    def _path_blocks(self, node: RadixNode, num_tokens: int) -> list[int]:
        num_blocks = cdiv(num_tokens, self.block_size)
        block_ids = [-1] * num_blocks
        filled_below = num_blocks  # indices >= this are already taken from a deeper node
        while node.parent is not None:  # up to its namespace's root
            first = node.start // self.block_size
            for offset in range(min(len(node.block_ids), filled_below - first)):
                block_ids[first + offset] = node.block_ids[offset]
            filled_below = min(filled_below, first)
            node = node.parent  # type: ignore[assignment]
        return block_ids

    # -- updates -----------------------------------------------------------------------------------------------
    def insert(self, token_ids: list[int], block_table: list[int], namespace: int = 0) -> RadixNode:
        """Cache `token_ids` whose K/V live in `block_table` (a request's table) in `namespace`; returns the node
        ending there.

        Parts already cached keep their blocks; the new suffix takes a reference on the request's blocks.
        """
        node, matched = self._walk(token_ids, split=True, namespace=namespace)
        if matched < len(token_ids):
            first = matched // self.block_size
            last = cdiv(len(token_ids), self.block_size)
            new_blocks = block_table[first:last]
            self.block_pool.incref(new_blocks)
            child = RadixNode(token_ids[matched:], matched, new_blocks, node)
            node.children[child.token_ids[0]] = child
            self.num_nodes += 1
            self.num_tokens += len(child.token_ids)
            node = child
        self._touch(node)
        return node

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Split `node` after `at` tokens; returns the new upper part (the lower part keeps `node`)."""
        boundary = node.start + at
        parent = node.parent
        assert parent is not None
        first_index = node.start // self.block_size
        num_upper_blocks = cdiv(boundary, self.block_size) - first_index
        upper = RadixNode(node.token_ids[:at], node.start, node.block_ids[:num_upper_blocks], parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        parent.children[upper.token_ids[0]] = upper
        lower_first = boundary // self.block_size - first_index
        if boundary % self.block_size:  # the block at the boundary now overlaps both halves
            self.block_pool.incref([node.block_ids[lower_first]])
        node.token_ids = node.token_ids[at:]
        node.block_ids = node.block_ids[lower_first:]
        node.start = boundary
        node.parent = upper
        upper.children[node.token_ids[0]] = node
        self.num_nodes += 1
        return upper

    def _touch(self, node: RadixNode) -> None:
        now = next(self._clock)
        bottom = node
        while node is not None:
            node.last_access = now
            node = node.parent  # type: ignore[assignment]
        self._push_if_evictable_leaf(bottom, now)  # the path's other nodes have a child on it

    def lock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        while node is not None:
            if node.lock_ref <= 0:
                raise ValueError(f"unlock of unlocked node {node}")
            node.lock_ref -= 1
            self._push_if_evictable_leaf(node, node.last_access)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_blocks: int) -> int:
        """Drop least-recently-used unlocked leaves until `num_blocks` blocks return to the pool (or none are left);
        returns how many blocks were freed."""
        free_before = self.block_pool.num_free_blocks
        while self._evictable and self.block_pool.num_free_blocks - free_before < num_blocks:
            access, _, leaf = heapq.heappop(self._evictable)  # (a push below may rebuild the list)
            if not self._is_evictable(leaf, access):
                continue
            parent = leaf.parent
            assert parent is not None
            if self.on_evict is not None:
                self.on_evict(leaf)
            del parent.children[leaf.token_ids[0]]
            self._drop(leaf)
            self._push_if_evictable_leaf(parent, parent.last_access)
        freed = self.block_pool.num_free_blocks - free_before
        self.num_evicted_blocks += freed  # blocks returned to the pool (a shared boundary block may stay held)
        return freed

    def _is_evictable(self, node: RadixNode, access: int) -> bool:
        """Whether the heap entry `(access, _, node)` is current: `node` is an attached, unlocked leaf last used at
        `access`."""
        return (node.parent is not None and node.lock_ref == 0 and not node.children
                and node.last_access == access)

    def _push_if_evictable_leaf(self, node: RadixNode, access: int) -> None:
        """Give `node` a heap entry when it is an unlocked leaf (the root never is: it holds a lock). Stale entries
        pile up as nodes are touched; past twice the live nodes the heap is rebuilt from the tree, which keeps its
        size O(nodes) at an amortized O(1) per push."""
        if node.lock_ref or node.children:
            return
        heapq.heappush(self._evictable, (access, next(self._pushes), node))
        if len(self._evictable) > 2 * self.num_nodes + 64:
            self._evictable = [(leaf.last_access, next(self._pushes), leaf) for leaf in self._leaves()
                               if leaf.lock_ref == 0]
            heapq.heapify(self._evictable)

    def remove_namespace(self, namespace: int) -> int:
        """Drop every node of `namespace` (> 0; none may be locked: no request of it is running); returns the
        blocks given back to the pool."""
        assert namespace != 0, "the base model's namespace stays"
        root = self._roots.pop(namespace, None)
        if root is None:
            return 0
        del self._namespaces[id(root)]
        free_before = self.block_pool.num_free_blocks
        stack = list(root.children.values())
        while stack:
            node = stack.pop()
            assert node.lock_ref == 0, f"{node} is locked"
            stack.extend(node.children.values())
            self._drop(node)
        return self.block_pool.num_free_blocks - free_before

    def _drop(self, node: RadixNode) -> None:
        """Detach `node` (its remaining heap entries become stale) and give back its blocks."""
        node.parent = None
        self.block_pool.free(node.block_ids)
        self.num_nodes -= 1
        self.num_tokens -= len(node.token_ids)

    def reset(self) -> None:
        """Drop every unlocked node (all of them when nothing is running)."""
        self.evict(self.block_pool.num_blocks)

    # -- introspection -----------------------------------------------------------------------------------------
    def path_of(self, node: RadixNode) -> tuple[int, list[int]]:
        """The namespace of an attached node and the tokens from its root to its end."""
        edges = []
        while node.parent is not None:
            edges.append(node.token_ids)
            node = node.parent
        return self._namespaces[id(node)], [token for edge in reversed(edges) for token in edge]

    def nodes(self, namespace: int) -> Iterator[RadixNode]:
        """Every node of `namespace` (below its root)."""
        return self._nodes([self._roots[namespace]] if namespace in self._roots else [])

    def _nodes(self, roots: Iterable[RadixNode] | None = None) -> Iterator[RadixNode]:
        roots = self._roots.values() if roots is None else roots
        stack = [child for root in roots for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _leaves(self) -> Iterator[RadixNode]:
        return (node for node in self._nodes() if not node.children)

    def block_refs(self) -> dict[int, int]:
        """Block id -> number of references the tree holds on it."""
        refs: dict[int, int] = {}
        for node in self._nodes():
            for block_id in node.block_ids:
                refs[block_id] = refs.get(block_id, 0) + 1
        return refs

    def check_invariants(self) -> None:
        """Edges are non-empty and keyed by their first token, positions chain, blocks cover each edge exactly,
        and a node's lock count covers the locks of its children."""
        nodes = list(self._nodes())
        assert (self.num_nodes, self.num_tokens) == (len(nodes), sum(len(n.token_ids) for n in nodes)), "counts"
        for node in self._nodes():
            parent = node.parent
            assert parent is not None and parent.children.get(node.token_ids[0]) is node, f"{node} badly linked"
            assert node.token_ids, f"{node} has an empty edge"
            assert node.start == parent.end, f"{node} does not start where {parent} ends"
            expected = cdiv(node.end, self.block_size) - node.start // self.block_size
            assert len(node.block_ids) == expected, f"{node} should hold {expected} blocks"
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), f"{node} lock below children"
            for block_id in node.block_ids:
                assert self.block_pool.ref_count(block_id) > 0, f"{node} holds free block {block_id}"
        current = {id(node) for access, _, node in self._evictable if self._is_evictable(node, access)}
        evictable = {id(node) for node in nodes if node.lock_ref == 0 and not node.children}
        assert current == evictable, "the eviction heap misses an unlocked leaf"
