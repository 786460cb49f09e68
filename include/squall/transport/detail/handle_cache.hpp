// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `handle_cache<Key, Value>`: the opened peer allocations of `cuda_ipc_transport`, kept
/// between calls (opening a CUDA IPC handle maps the allocation, tens of microseconds) and
/// closed when evicted, erased or at the end. Least recently used first out, at most
/// `capacity` entries. Pure host code: `tests/unit/handle_cache.test.cpp` tests it without a
/// device.

#include <squall/core/error.hpp>

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <utility>

namespace squall::detail {

template <class Key, class Value>
class handle_cache {
 public:
  using closer = std::function<void(const Key&, Value&)>;

  /// `close(key, value)` ends an entry evicted, erased or left at destruction (it must not
  /// throw).
  handle_cache(std::size_t capacity, closer close) : capacity_(capacity), close_(std::move(close)) {
    if (capacity_ == 0) {
      throw invalid_argument({.operation = "handle_cache"}, "capacity must be positive");
    }
  }
  handle_cache(const handle_cache&) = delete;
  handle_cache& operator=(const handle_cache&) = delete;
  ~handle_cache() { clear(); }

  /// The entry of `key`, now the most recently used, or null (a miss).
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    ++hits_;
    return &it->second->second;
  }

  /// Adds `value` for `key` (absent), the most recently used; closes the least recently used
  /// entry first if the cache is full.
  void insert(const Key& key, Value value) {
    if (order_.size() == capacity_) close_at(std::prev(order_.end()));
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    ++misses_;
  }

  /// Closes and removes the entry of `key`, if any.
  void erase(const Key& key) {
    if (const auto it = index_.find(key); it != index_.end()) close_at(it->second);
  }

  /// Closes and removes every entry whose key satisfies `pred`; how many.
  template <class Pred>
  std::size_t erase_if(Pred pred) {
    std::size_t n = 0;
    for (auto it = order_.begin(); it != order_.end();) {
      const auto next = std::next(it);
      if (pred(it->first)) {
        close_at(it);
        ++n;
      }
      it = next;
    }
    return n;
  }

  /// Closes every entry.
  void clear() noexcept {
    while (!order_.empty()) close_at(std::prev(order_.end()));
  }

  std::size_t size() const { return order_.size(); }
  std::size_t hits() const { return hits_; }
  std::size_t misses() const { return misses_; }

 private:
  using entries = std::list<std::pair<Key, Value>>;

  void close_at(typename entries::iterator it) noexcept {
    close_(it->first, it->second);
    index_.erase(it->first);
    order_.erase(it);
  }

  std::size_t capacity_;
  closer close_;
  entries order_;  // most recently used first
  std::map<Key, typename entries::iterator> index_;
  std::size_t hits_ = 0;
  std::size_t misses_ = 0;
};

}  // namespace squall::detail
