// The engine's scheduler (see engine.h for the step). Only the engine thread touches the
// backend, the slots and the running sequences; the only shared structures are the incoming
// queue (in_mu_) and each Job's event queue.
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "common/error.h"
#include "runtime/engine_seq.h"

namespace cm::runtime {

using Clock = std::chrono::steady_clock;
static double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

static JobEvent cancelled_event() {
  JobEvent e;
  e.kind = JobEvent::Finish;
  e.finish_reason = "cancelled";
  return e;
}

void Job::push(JobEvent e) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::vector<JobEvent> Job::pop(int timeout_ms) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  std::vector<JobEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

Engine::Engine(ModelBackend& backend, const Tokenizer* tok, int64_t vocab, EngineOptions opt, EngineMetrics* metrics)
    : be_(backend), tok_(tok), vocab_(vocab), opt_(std::move(opt)), metrics_(metrics) {
  CM_CHECK(opt_.max_seqs >= 1, "--max-seqs must be >= 1 (got {})", opt_.max_seqs);
  CM_CHECK(opt_.max_step_tokens >= opt_.max_seqs,
           "--max-step-tokens ({}) must be at least --max-seqs ({}) so every running sequence decodes each step",
           opt_.max_step_tokens, opt_.max_seqs);
  CM_CHECK(opt_.ctx >= 2, "--ctx must be >= 2 (got {})", opt_.ctx);
  CM_CHECK(opt_.mtp_draft >= 0 && opt_.mtp_draft <= kMaxDraft, "--mtp {} outside [0, {}] (drafts per step)",
           opt_.mtp_draft, kMaxDraft);
  if (opt_.mtp_draft > 0 && !be_.has_mtp())
    fail("--mtp {}: the backend runs no MTP block (the model was loaded without it, or runs over several ranks)",
         opt_.mtp_draft);
  const CacheShape& have = be_.shape();
  if (have.max_slots != opt_.max_seqs || have.max_step_tokens != opt_.max_step_tokens || have.max_ctx != opt_.ctx)
    be_.reserve(CacheShape{opt_.max_seqs, opt_.max_step_tokens, opt_.ctx});
  if (opt_.mtp_draft > 0)
    CM_CHECK(opt_.mtp_draft + 1 <= be_.undo_token_limit(),
             "--mtp {}: a verify run of {} tokens exceeds the {} tokens this model's state can roll back", opt_.mtp_draft,
             opt_.mtp_draft + 1, be_.undo_token_limit());
  for (int32_t s = 0; s < opt_.max_seqs; ++s) be_.reset_slot(s);
  slots_.resize(size_t(opt_.max_seqs));
  // A step asks for at most one logits row per slot (its decode token or its prompt's last token),
  // with MTP 1 + drafts per decoding slot.
  logits_.resize(size_t(std::min<int64_t>(int64_t(opt_.max_seqs) * (1 + opt_.mtp_draft), opt_.max_step_tokens)) *
                 size_t(vocab_));
}

Engine::~Engine() { stop(); }

void Engine::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> l(in_mu_);
    incoming_.push_back(std::move(job));
    ++n_incoming_;
  }
  in_cv_.notify_all();
}

void Engine::submit(std::vector<std::shared_ptr<Job>> jobs) {
  {
    std::lock_guard<std::mutex> l(in_mu_);
    for (auto& j : jobs) {
      incoming_.push_back(std::move(j));
      ++n_incoming_;
    }
  }
  in_cv_.notify_all();
}

void Engine::start() { thread_ = std::thread([this] { run(); }); }

void Engine::stop() {
  stop_ = true;
  in_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Whatever is left ends now, so no HTTP thread waits forever.
  take_incoming();
  while (!running_.empty()) finish(*running_.front(), "cancelled", false);
  for (auto& j : waiting_) j->push(cancelled_event());
  waiting_.clear();
}

bool Engine::idle() const { return n_running_ == 0 && n_waiting_ == 0 && n_incoming_ == 0; }

JobEvent Engine::generate(JobSpec spec, const std::function<void(const JobEvent&)>& on_event,
                          const std::atomic<bool>* cancel) {
  CM_CHECK(!thread_.joinable(), "Engine::generate runs a job on the caller's thread, but the engine thread runs");
  auto job = std::make_shared<Job>(std::move(spec));
  submit(job);
  for (;;) {
    if (cancel && cancel->load()) job->cancelled = true;
    const bool worked = step_once();
    for (JobEvent& e : job->pop(0)) {
      if (on_event) on_event(e);
      if (e.kind == JobEvent::Finish) return std::move(e);
    }
    CM_CHECK(worked, "engine: job {} neither ran nor finished", job->spec.id);
  }
}

void Engine::drop_cached_prefixes() {
  for (int32_t s = 0; s < int32_t(slots_.size()); ++s) {
    if (slots_[size_t(s)].busy) continue;
    slots_[size_t(s)].held.clear();
    be_.reset_slot(s);
  }
}

void Engine::run() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> l(in_mu_);
      in_cv_.wait_for(l, std::chrono::milliseconds(50),
                      [&] { return stop_ || !incoming_.empty() || !running_.empty() || !waiting_.empty(); });
    }
    if (stop_) break;
    if (!step_once() && opt_.on_idle) opt_.on_idle();
  }
}

void Engine::take_incoming() {
  std::lock_guard<std::mutex> l(in_mu_);
  while (!incoming_.empty()) {
    waiting_.push_back(std::move(incoming_.front()));
    incoming_.pop_front();
    --n_incoming_;
    ++n_waiting_;
  }
}

void Engine::drop_cancelled() {
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->job->cancelled) finish(*running_[i], "cancelled", false);  // erases running_[i]
    else ++i;
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled) {
      (*it)->push(cancelled_event());
      if (metrics_) metrics_->request_finished("cancelled");
      it = waiting_.erase(it);
      --n_waiting_;
    } else {
      ++it;
    }
  }
}

// The slot for a prompt: the slot holding the longest proper prefix of it (a free one is used as
// it is; a busy one is copied into a free slot), else the least recently used free slot.
int32_t Engine::choose_slot(const std::vector<int32_t>& prompt, int64_t* reused) {
  int32_t best = -1, lru = -1;
  size_t best_len = 0;
  for (int32_t s = 0; s < int32_t(slots_.size()); ++s) {
    const Slot& sl = slots_[size_t(s)];
    if (!sl.busy && (lru < 0 || sl.last_used < slots_[size_t(lru)].last_used)) lru = s;
    const size_t n = sl.held.size();
    if (n == 0 || n >= prompt.size() || n <= best_len) continue;
    if (!std::equal(sl.held.begin(), sl.held.end(), prompt.begin())) continue;
    best = s;
    best_len = n;
  }
  if (lru < 0) return -1;
  *reused = int64_t(best_len);
  if (best >= 0) {
    Slot& b = slots_[size_t(best)];
    // A snapshot stays for the prompts after this one: copied into another free slot while there is one.
    const int32_t to = b.busy || b.snapshot ? lru_free(best) : -1;
    if (to < 0) {  // a free slot taken as it is (a snapshot: the last free slot)
      b.snapshot = false;
      return best;
    }
    be_.copy_slot(best, to);
    slots_[size_t(to)].held = b.held;
    slots_[size_t(to)].snapshot = false;
    b.last_used = ++clock_;  // a snapshot in use is the last to go
    return to;
  }
  be_.reset_slot(lru);
  slots_[size_t(lru)].held.clear();
  slots_[size_t(lru)].snapshot = false;
  return lru;
}

int64_t Engine::shared_prefix(const std::vector<int32_t>& prompt) const {
  int64_t most = 0;
  for (const Slot& sl : slots_) {
    const size_t n = std::min(sl.held.size(), prompt.size());
    most = std::max<int64_t>(most, std::mismatch(sl.held.begin(), sl.held.begin() + n, prompt.begin()).first -
                                       sl.held.begin());
  }
  return most;
}

int32_t Engine::lru_free(int32_t except) const {
  int32_t to = -1;
  for (int32_t t = 0; t < int32_t(slots_.size()); ++t) {
    const Slot& sl = slots_[size_t(t)];
    if (t != except && !sl.busy && (to < 0 || sl.last_used < slots_[size_t(to)].last_used)) to = t;
  }
  return to;
}

void Engine::snapshot(Seq& s) {
  s.snap_at = 0;
  const int32_t to = lru_free(s.slot);
  if (to < 0) return;  // no free slot this step: no snapshot
  const Slot& from = slots_[size_t(s.slot)];
  CM_CHECK(int64_t(from.held.size()) == s.fed, "engine: snapshot of slot {} at {} tokens, it holds {}", s.slot, s.fed,
           from.held.size());
  be_.copy_slot(s.slot, to);
  Slot& sn = slots_[size_t(to)];
  sn.held = from.held;
  sn.snapshot = true;
  sn.last_used = ++clock_;
}

void Engine::share_in_flight(Seq& s) {
  const auto& p = s.job->spec.prompt;
  Seq* by = nullptr;
  int64_t len = 0;
  for (const auto& r : running_) {
    if (!r->prefilling() || r->job->spec.prompt_logprobs) continue;
    const auto& q = r->job->spec.prompt;
    const size_t n = std::min(p.size(), q.size());
    const int64_t l = std::mismatch(p.begin(), p.begin() + int64_t(n), q.begin()).first - p.begin();
    if (l > len) len = l, by = r.get();
  }
  // A proper prefix of this prompt (its last token is its own to feed), well past what it reused, that
  // the other has yet to compute.
  if (!by || len >= int64_t(p.size()) || len < s.fed + kMinShared || by->fed >= len) return;
  s.wait_job = by->job;
  s.wait_until = len;
  // The other pauses there for a snapshot (unless it already pauses earlier for another).
  if (by->snap_at <= by->fed || len < by->snap_at) by->snap_at = len;
}

bool Engine::waits_for_shared(Seq& s) {
  if (!s.wait_job) return false;
  for (const auto& r : running_)
    if (r->job == s.wait_job && r->prefilling() && r->fed < s.wait_until) return true;
  s.wait_job.reset();
  // The longest slot state that is a proper prefix of the prompt, well past what s holds: the other's
  // own slot while it is paused there, or its snapshot.
  const auto& p = s.job->spec.prompt;
  int32_t from = -1;
  size_t len = size_t(s.fed + kMinShared - 1);
  for (int32_t t = 0; t < int32_t(slots_.size()); ++t) {
    const auto& h = slots_[size_t(t)].held;
    if (t == s.slot || h.size() <= len || h.size() >= p.size() || h.back() != p[h.size() - 1]) continue;
    if (!std::equal(h.begin(), h.end(), p.begin())) continue;
    from = t;
    len = h.size();
  }
  if (from >= 0) {
    be_.copy_slot(from, s.slot);
    slots_[size_t(s.slot)].held = slots_[size_t(from)].held;
    slots_[size_t(from)].last_used = ++clock_;
    s.reused += int64_t(len) - s.fed;
    s.fed = int64_t(len);
  }
  if (metrics_) metrics_->prefix_cache(int64_t(p.size()), s.reused);  // its query, held back at admission
  return false;
}

// A fork waits while the job it copies is running and has not yet fed all of its prompt but the
// last token. Once that job went past its prompt (or ended), the fork is admitted as any job.
bool Engine::waits_for_fork(const Job& j) const {
  if (!j.spec.fork_of) return false;
  for (const auto& s : running_)
    if (s->job == j.spec.fork_of) return s->fed < int64_t(s->job->spec.prompt.size()) - 1;
  return false;
}

void Engine::admit() {
  while (!waiting_.empty()) {
    int64_t reused = 0;
    const auto& prompt = waiting_.front()->spec.prompt;
    if (waits_for_fork(*waiting_.front())) return;
    int32_t slot;
    const bool no_reuse = waiting_.front()->spec.prompt_logprobs || !opt_.prefix_caching;
    if (no_reuse) {
      // Every prompt row's logits are needed (or prefix caching is off), so nothing is reused: a fresh
      // least recently used slot.
      std::vector<int32_t> none;
      slot = choose_slot(none, &reused);
    } else {
      slot = choose_slot(prompt, &reused);
    }
    if (slot < 0) return;
    // Where this prompt's shared part with another sequence ends, if that is well past what it reuses.
    const int64_t shared = no_reuse ? 0 : shared_prefix(prompt);
    auto seq = std::make_unique<Seq>(std::move(waiting_.front()), tok_, opt_);
    waiting_.pop_front();
    --n_waiting_;
    ++n_running_;
    seq->slot = slot;
    seq->fed = reused;
    seq->reused = reused;
    seq->hist = seq->job->spec.prompt;
    seq->arrival = seq->job->arrival;
    seq->hold_last = seq->job->spec.forks > 0 && reused < int64_t(prompt.size()) - 1;
    if (shared >= reused + kMinShared && shared < int64_t(seq->job->spec.prompt.size())) seq->snap_at = shared;
    if (!no_reuse && seq->job->spec.forks == 0 && !seq->job->spec.fork_of) share_in_flight(*seq);
    // A step's logits rows: 1 + drafts per slot, kPromptRows more for prompt_logprobs; never past its tokens.
    const size_t rows = size_t(std::min<int64_t>(int64_t(opt_.max_seqs) * (1 + opt_.mtp_draft) + kPromptRows,
                                                 opt_.max_step_tokens));
    if (seq->job->spec.prompt_logprobs && logits_.size() < rows * size_t(vocab_)) logits_.resize(rows * size_t(vocab_));
    std::string bad_constraint;
    if (seq->job->spec.constraint) {
      try {
        seq->constraint = seq->job->spec.constraint->make(vocab_, opt_.eos_ids);
      } catch (const std::exception& e) {
        bad_constraint = e.what();
      }
    }
    slots_[size_t(slot)].busy = true;
    slots_[size_t(slot)].last_used = ++clock_;
    if (metrics_) {
      if (!seq->wait_job) metrics_->prefix_cache(int64_t(prompt.size()), reused);  // a waiting one: once it goes on
      metrics_->add_prompt_tokens(int64_t(seq->hist.size()));
    }
    running_.push_back(std::move(seq));
    if (!bad_constraint.empty()) finish(*running_.back(), "error", false, bad_constraint);
  }
}

bool Engine::step_once() {
  const Clock::time_point t_begin = Clock::now();
  take_incoming();
  drop_cancelled();
  admit();
  if (metrics_) metrics_->set_queue(int64_t(running_.size()), int64_t(waiting_.size()));
  if (running_.empty()) return false;

  // The batch: decode tokens first, then prefill chunks in admission order under the budget.
  const Clock::time_point t_draft0 = Clock::now();
  if (opt_.mtp_draft > 0) make_drafts();
  if (running_.empty()) return true;  // every job ended on a failed draft
  const Clock::time_point t_drafted = Clock::now();
  // Prompts waiting for another's shared part (before this step's tokens extend any slot's held):
  // those still waiting keep their wait_job and feed nothing this step.
  for (auto& s : running_)
    if (s->prefilling()) waits_for_shared(*s);
  b_token_.clear(), b_pos_.clear(), b_slot_.clear(), b_logits_.clear(), b_undo_.clear();
  bool speculating = false;
  // The sequence of each logits row, in order, and the prompt position of a prompt_logprobs row
  // (-1: a row to sample from).
  std::vector<std::pair<Seq*, int64_t>> row_seq;
  auto add = [&](Seq& s, int32_t tok, bool want, int64_t prompt_pos = -1, bool undo = false) {
    b_token_.push_back(tok);
    b_pos_.push_back(int32_t(slots_[size_t(s.slot)].held.size()));
    b_slot_.push_back(s.slot);
    b_logits_.push_back(want ? 1 : 0);
    b_undo_.push_back(undo ? 1 : 0);
    slots_[size_t(s.slot)].held.push_back(tok);
    if (want) row_seq.emplace_back(&s, prompt_pos);
  };
  // A speculating sequence's rows: its next token, then its drafts, all with logits, one undoable run
  // (row_seq gets one entry per row; verify() takes them together).
  for (auto& s : running_) {
    if (s->prefilling()) continue;
    const bool spec = !s->drafts.empty();
    speculating = speculating || spec;
    add(*s, s->pending, true, -1, spec);
    for (int32_t d : s->drafts) add(*s, d, true, -1, true);
  }
  int64_t budget = opt_.max_step_tokens - int64_t(b_token_.size());
  std::vector<std::pair<Seq*, int64_t>> chunks;
  int64_t prompt_rows = kPromptRows;  // logits rows left for prompt_logprobs (beyond one per sequence)
  for (auto& s : running_) {
    if (!s->prefilling() || budget <= 0) continue;
    if (s->wait_job) continue;
    const auto& p = s->job->spec.prompt;
    const int64_t len = int64_t(p.size());
    const bool every_row = s->job->spec.prompt_logprobs;
    int64_t n = std::min<int64_t>(budget, s->prefill_end() - s->fed);
    // A prompt_logprobs chunk's rows but its prompt's last count against prompt_rows.
    if (every_row && std::min(n, len - 1 - s->fed) > prompt_rows) n = prompt_rows;
    if (n <= 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = s->fed + i;
      const bool last = pos + 1 == len;
      add(*s, p[size_t(pos)], last || every_row, last ? -1 : pos);
      if (every_row && !last) --prompt_rows;
    }
    chunks.emplace_back(s.get(), n);
    budget -= n;
  }
  Batch b;
  b.n = int32_t(b_token_.size());
  b.token = b_token_.data();
  b.pos = b_pos_.data();
  b.slot = b_slot_.data();
  b.logits = b_logits_.data();
  if (speculating) b.undo = b_undo_.data();
  std::vector<std::pair<Seq*, std::string>> failed;
  // Sampling on the backend: every logits row a token to draw for a job without a grammar (logprobs,
  // with at most kMaxSampleTopN alternatives, come back with the tokens).
  bool on_device = opt_.sample_on_device && be_.samples_on_device() && !row_seq.empty() &&
                   int64_t(row_seq.size()) <= be_.max_sample_rows();
  std::vector<Seq*> dev_seqs;
  for (const auto& [s, pos] : row_seq)
    on_device = on_device && pos < 0 && !s->constraint && s->job->spec.logprobs <= kMaxSampleTopN;
  if (on_device) {
    for (const auto& [s, pos] : row_seq) dev_seqs.push_back(s);
    try {
      on_device = build_device_sampling(dev_seqs);
    } catch (const std::exception&) {
      on_device = false;  // the host path draws row by row and ends only the job at fault
    }
  }
  const Clock::time_point t_step = Clock::now();
  // Where the step's time went (metrics): the drafts and the backend's step, sampling, the engine's own.
  auto report = [&](Clock::time_point t_stepped, Clock::time_point t_sampled) {
    if (!metrics_) return;
    const double drafts = opt_.mtp_draft > 0 ? seconds(t_draft0, t_drafted) : 0.0;
    const double backend = drafts + seconds(t_step, t_stepped), sample = seconds(t_stepped, t_sampled);
    metrics_->engine_step(int64_t(b.n), backend, sample, std::max(0.0, seconds(t_begin, Clock::now()) - backend - sample));
  };
  try {
    be_.step(b, on_device ? nullptr : logits_.data());
  } catch (const std::exception& e) {
    on_device = false;  // the retry below returns logits
    // The backend left every slot as it was. Run each sequence's rows alone, so a failure (a
    // non-finite step, a token the model rejects) ends only the sequence that caused it.
    std::fprintf(stderr, "engine: step of %d tokens failed (%s); retrying sequence by sequence\n", b.n, e.what());
    size_t row = 0;
    for (int32_t i = 0; i < b.n;) {
      int32_t j = i;
      size_t rows = 0;
      while (j < b.n && b_slot_[size_t(j)] == b_slot_[size_t(i)]) rows += b_logits_[size_t(j++)];
      Batch one{j - i, b.token + i, b.pos + i, b.slot + i, b.logits + i};
      if (b.undo) one.undo = b.undo + i;
      try {
        be_.step(one, logits_.data() + row * size_t(vocab_));
      } catch (const std::exception& e1) {
        for (auto& sq : running_)
          if (sq->slot == b_slot_[size_t(i)]) failed.emplace_back(sq.get(), e1.what());
      }
      row += rows;
      i = j;
    }
  }
  auto is_failed = [&](const Seq* s) {
    return std::any_of(failed.begin(), failed.end(), [&](const auto& f) { return f.first == s; });
  };
  for (auto& [s, n] : chunks)
    if (!is_failed(s)) {
      s->fed += n;
      if (s->snap_at > 0 && s->fed == s->snap_at) snapshot(*s);
    }
  ++spec_.steps;
  const Clock::time_point t_stepped = Clock::now();
  if (on_device) {
    sample_rows_on_device(dev_seqs);
    report(t_stepped, Clock::now());
    return true;
  }
  // Sampling may finish sequences (erasing them from running_); every row's sequence is still
  // alive when its turn comes, since a sequence's only rows to sample from are its last (one, or a
  // speculating sequence's 1 + drafts, taken together).
  for (size_t r = 0; r < row_seq.size();) {
    auto [s, pos] = row_seq[r];
    const size_t rows = 1 + s->drafts.size();
    const float* row = logits_.data() + r * size_t(vocab_);
    r += rows;
    if (is_failed(s)) continue;
    if (rows > 1) verify(*s, row);
    else if (pos >= 0) on_prompt_row(*s, pos, row);
    else on_logits(*s, row);
  }
  const Clock::time_point t_sampled = Clock::now();
  for (auto& [s, what] : failed) {
    slots_[size_t(s->slot)].held.clear();
    be_.reset_slot(s->slot);
    finish(*s, "error", false, what);
  }
  report(t_stepped, t_sampled);
  return true;
}

// Raw log-probabilities of the chosen token and of the top-k alternatives.
static void logprobs_of(const float* row, int64_t vocab, int32_t id, int k, TokenOut& out) {
  float mx = row[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v] - mx));
  const float lse = mx + float(std::log(sum));
  out.logprob = row[id] - lse;
  if (k <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) ids[size_t(v)] = int32_t(v);
  const size_t kk = std::min<size_t>(size_t(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(),
                    [&](int32_t a, int32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
  for (size_t i = 0; i < kk; ++i) out.top.push_back({ids[i], row[ids[i]] - lse});
}

// Row `pos` of a prompt_logprobs prompt: the raw logprob of the prompt token after it.
void Engine::on_prompt_row(Seq& s, int64_t pos, const float* row) {
  TokenOut t;
  t.id = s.job->spec.prompt[size_t(pos + 1)];
  logprobs_of(row, vocab_, t.id, std::max(s.job->spec.logprobs, 0), t);
  s.prompt_lp.push_back(std::move(t));
}

bool Engine::on_logits(Seq& s, const float* row) {
  int32_t id;
  try {
    TokenConstraint::Constrained c{row, &s.rule.banned()};
    if (s.constraint) c = s.constraint->constrain(row, s.rule.banned());
    id = s.sampler.sample(c.row, vocab_, int64_t(s.hist.size()), *c.banned);
  } catch (const std::exception& e) {
    finish(s, "error", false, e.what());
    return false;
  }
  ++spec_.emitted;
  return on_token(s, id, row);
}

// seqs: each row's sequence; a speculating sequence's 1 + k rows come together (row j after its drafts
// 0..j-1: the draw counter, the penalties' counts and min_tokens' bans as if they were accepted).
bool Engine::build_device_sampling(const std::vector<Seq*>& seqs) {
  const size_t R = seqs.size();
  d_params_.resize(R), d_token_.assign(R, -1), d_logprob_.assign(R, 0.0f), d_offsets_.assign(R + 1, 0);
  d_top_n_ = 0;
  for (const Seq* s : seqs) d_top_n_ = std::max(d_top_n_, int32_t(s->job->spec.logprobs));
  d_top_id_.assign(R * size_t(d_top_n_), -1);
  d_top_lp_.assign(R * size_t(d_top_n_), 0.0f);
  d_adj_.clear();
  d_mask_.clear();  // filled (all allowed) only when some row bans ids
  const int64_t mask_words = (vocab_ + 31) / 32;
  int64_t j = 0;  // the row's index within its sequence's rows
  for (size_t r = 0; r < R; ++r) {
    Seq& s = *seqs[r];
    j = r > 0 && seqs[r - 1] == &s ? j + 1 : 0;
    d_params_[r] = s.sampler.params(int64_t(s.hist.size()) + j);
    // The sampler's bias and penalty ids; the stop rule's banned ids (the host path sets their logits
    // to -inf) as cleared bits of the row's allowed-token mask.
    const std::vector<SampleAdjust>& a = s.sampler.adjustments(vocab_, s.drafts.data(), j);
    d_adj_.insert(d_adj_.end(), a.begin(), a.end());
    const std::vector<int32_t>& banned = s.rule.banned_after(j);
    if (!banned.empty() && d_mask_.empty()) d_mask_.assign(R * size_t(mask_words), ~0u);
    for (int32_t id : banned)
      if (id >= 0 && id < vocab_) d_mask_[r * size_t(mask_words) + size_t(id / 32)] &= ~(1u << (id % 32));
    d_offsets_[r + 1] = int64_t(d_adj_.size());
  }
  return int64_t(d_adj_.size()) <= ModelBackend::kMaxSampleAdjust;
}

bool Engine::sample_rows_on_device(const std::vector<Seq*>& seqs) {
  const size_t R = seqs.size();
  StepSampling ss;
  ss.params = d_params_.data();
  if (!d_adj_.empty()) ss.adj = d_adj_.data(), ss.adj_offsets = d_offsets_.data();
  if (!d_mask_.empty()) ss.mask = d_mask_.data(), ss.mask_words = (vocab_ + 31) / 32;
  ss.token = d_token_.data();
  ss.logprob = d_logprob_.data();
  if (d_top_n_ > 0) ss.top_n = d_top_n_, ss.top_id = d_top_id_.data(), ss.top_logprob = d_top_lp_.data();
  try {
    be_.sample_last_step(ss);
  } catch (const std::exception& e) {
    // The step has run: its rows cannot be retried one by one. End the step's jobs with the error.
    for (Seq* s : seqs) {
      slots_[size_t(s->slot)].held.clear();
      be_.reset_slot(s->slot);
      finish(*s, "error", false, e.what());
    }
    return false;
  }
  // Drawing may finish sequences (erasing them from running_): a sequence's rows are taken together.
  std::vector<TokenOut> lps;
  for (size_t r = 0; r < R;) {
    Seq& s = *seqs[r];
    const size_t rows = 1 + s.drafts.size();
    const int k = s.job->spec.logprobs;
    lps.assign(rows, TokenOut{});
    for (size_t i = 0; i < rows && k >= 0; ++i) {
      lps[i].logprob = d_logprob_[r + i];
      for (int t = 0; t < k; ++t) {
        const size_t at = (r + i) * size_t(d_top_n_) + size_t(t);
        if (d_top_id_[at] >= 0) lps[i].top.push_back({d_top_id_[at], d_top_lp_[at]});
      }
    }
    if (rows > 1) {
      verify(s, nullptr, d_token_.data() + r, k >= 0 ? lps.data() : nullptr);
    } else {
      ++spec_.emitted;
      on_token(s, d_token_[r], nullptr, k >= 0 ? lps.data() : nullptr);
    }
    r += rows;
  }
  return true;
}

bool Engine::on_token(Seq& s, int32_t id, const float* row, const TokenOut* lp) {
  const JobSpec& spec = s.job->spec;
  const auto now = Clock::now();
  if (s.generated == 0) {
    s.first_token = now;
    if (metrics_) metrics_->observe_ttft(seconds(s.arrival, now));
  } else if (metrics_) {
    metrics_->observe_inter_token(seconds(s.last_token, now));
  }
  s.last_token = now;
  s.hist.push_back(id);
  s.sampler.add(id);
  ++s.generated;
  if (metrics_) metrics_->add_generation_tokens(1);
  JobEvent ev;
  TokenOut t;
  t.id = id;
  if (spec.logprobs >= 0 && row) logprobs_of(row, vocab_, id, spec.logprobs, t);
  if (spec.logprobs >= 0 && lp) t.logprob = lp->logprob, t.top = lp->top;
  ev.tokens.push_back(std::move(t));
  if (spec.prompt_logprobs && s.generated == 1) {
    TokenOut first;
    first.id = spec.prompt[0];
    first.logprob = NAN;
    ev.prompt_logprobs.push_back(first);
    for (TokenOut& p : s.prompt_lp) ev.prompt_logprobs.push_back(std::move(p));
    s.prompt_lp.clear();
  }
  if (s.constraint) {
    const TokenConstraint::Step st = s.constraint->accept(id);
    if (st == TokenConstraint::Step::Rejected) {
      finish(s, "error", false, "engine: the grammar rejected a sampled token");
      return false;
    }
    if (st == TokenConstraint::Step::Terminated) {
      // The grammar is complete and an end id was sampled: the job ends as on EOS (the id is not
      // text), whatever min_tokens or ignore_eos say (nothing else could follow).
      s.job->push(std::move(ev));
      finish(s, "stop", true);
      return false;
    }
  }
  StopVerdict v = s.rule.on_token(id);
  ev.text = std::move(v.text);
  s.job->push(std::move(ev));
  if (v.done) {
    finish(s, v.reason, v.eos);
    return false;
  }
  s.pending = id;
  return true;
}

void Engine::finish(Seq& s, const std::string& reason, bool eos, const std::string& error) {
  JobEvent ev;
  ev.kind = JobEvent::Finish;
  if (reason == "stop" || reason == "length" || (reason == "cancelled" && s.job->spec.release_held_on_cancel))
    ev.text = s.rule.finish();
  ev.finish_reason = reason;
  ev.eos = eos;
  ev.error = error;
  ev.prompt_tokens = int64_t(s.job->spec.prompt.size());
  ev.completion_tokens = s.generated;
  ev.cached_tokens = s.reused;
  const auto now = Clock::now();
  if (metrics_) {
    metrics_->request_finished(reason);
    metrics_->observe_e2e(seconds(s.arrival, now));
  }
  s.job->push(std::move(ev));
  Slot& sl = slots_[size_t(s.slot)];
  sl.busy = false;
  sl.last_used = ++clock_;
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == &s; });
  running_.erase(it);
  --n_running_;
}

}  // namespace cm::runtime
