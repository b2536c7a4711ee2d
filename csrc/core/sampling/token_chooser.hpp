// Choosing one token from each row of logits a step produced: on the calling thread, spread
// over the sampling pool (one row an item), or with each row's first pass split over the
// pool (choose_split). Which way is a pure decision (TokenChooser::decide), tested
// directly; docs/performance.md has the measurements behind the thresholds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/params.hpp"
#include "core/threads/pool.hpp"
#include "core/sampling/sampling.hpp"

namespace fastpar {

// Below this many rows to choose from (or prompts to tokenize) a step works on one
// thread: waking the pool costs more than it saves.
constexpr size_t kMinPooled = 8;
// Nor is a step pooled below this much work: a logit of a greedy row (an argmax) is one
// unit and of any other chain four, about what a row of each costs. Eight rows of
// device-sampling candidates are then chosen on the calling thread greedy and pooled with
// a typical sampler; eight whole rows always are pooled.
constexpr int64_t kMinPooledWork = 262144;
// Below kMinPooled rows, from this many whole rows a GPU copied out each row's first pass
// is split over the pool (policy split_rows); a single row stays on the calling thread,
// where it is as fast.
constexpr size_t kMinSplit = 2;

class TokenChooser {
public:
    enum class Way { OneThread, Pooled, Split };

    // `pool` may be null (everything on the calling thread); `split_rows`: StepPolicy's.
    TokenChooser(TaskPool * pool, bool split_rows)
        : pool_(pool), split_rows_(split_rows && pool != nullptr && pool->n_threads() > 1) {}

    // kMinPooledWork's units for choosing from `row` with a chain of shape `shape`.
    static int64_t work(const ChainShape & shape, const LogitRow & row) {
        return int64_t{row.n} * (shape.greedy ? 1 : 4);
    }

    // The way for `n_rows` rows of `work` units in all, with a pool or not, splitting
    // allowed or not (split_rows), and whether every row splits() (asked only when
    // splitting could be chosen).
    static Way decide(size_t n_rows, int64_t work, bool have_pool, bool split_rows, bool rows_split) {
        if (have_pool && n_rows >= kMinPooled && work >= kMinPooledWork) {
            return Way::Pooled;
        }
        if (split_rows && n_rows >= kMinSplit && n_rows < kMinPooled && rows_split) {
            return Way::Split;
        }
        return Way::OneThread;
    }

    // Calls pick(i) once for every row i, on the way decided for them; `shape_of(i)` is
    // the shape of row i's chain, `work` the rows' units in all. Each row has its own chain, so
    // the tokens are those picked one after another. Exceptions from pick pass through.
    template <class ShapeOf, class Pick>
    Way choose(std::vector<LogitRow> & rows, int64_t work, const ShapeOf & shape_of, const Pick & pick) {
        const size_t n = rows.size();
        bool rows_split = split_rows_ && n >= kMinSplit && n < kMinPooled;
        for (size_t i = 0; rows_split && i < n; ++i) {
            rows_split = splits(shape_of(i), rows[i]);
        }
        const Way way = decide(n, work, pool_ != nullptr, split_rows_, rows_split);
        switch (way) {
            case Way::Pooled:
                pool_->run(n, pick);
                break;
            case Way::Split:
                choose_split(*pool_, rows, split_maxima_, pick);
                break;
            case Way::OneThread:
                for (size_t i = 0; i < n; ++i) {
                    pick(i);
                }
                break;
        }
        return way;
    }

private:
    TaskPool * pool_;
    bool split_rows_;
    std::vector<float> split_maxima_;  // whole rows' block maxima when a step splits them
};

}  // namespace fastpar
