// Internal: compile-time facts about the functions idem::resilient and idem::operation wrap.
//
// Thread-safety: types only.
#pragma once

#include <stop_token>
#include <tuple>
#include <type_traits>

namespace idem {
struct AttemptContext;
}

namespace idem::detail {

template <class... T>
struct TypeList {};

// The return type and parameter list of a non-generic callable.
template <class F, class = void>
struct CallableTraits {
  static constexpr bool known = false;
};

template <class R, class... A>
struct CallableTraits<R (*)(A...), void> {
  static constexpr bool known = true;
  using result = R;
  using params = TypeList<A...>;
};
template <class R, class... A>
struct CallableTraits<R (*)(A...) noexcept, void> : CallableTraits<R (*)(A...)> {};
template <class R, class... A>
struct CallableTraits<R(A...), void> : CallableTraits<R (*)(A...)> {};

template <class M>
struct MemberCallTraits {
  static constexpr bool known = false;
};
#define IDEM_DETAIL_MEMBER_CALL(QUALS)            \
  template <class R, class C, class... A>         \
  struct MemberCallTraits<R (C::*)(A...) QUALS> { \
    static constexpr bool known = true;           \
    using result = R;                             \
    using params = TypeList<A...>;                \
  };
IDEM_DETAIL_MEMBER_CALL()
IDEM_DETAIL_MEMBER_CALL(const)
IDEM_DETAIL_MEMBER_CALL(noexcept)
IDEM_DETAIL_MEMBER_CALL(const noexcept)
IDEM_DETAIL_MEMBER_CALL(&)
IDEM_DETAIL_MEMBER_CALL(const&)
IDEM_DETAIL_MEMBER_CALL(&noexcept)
IDEM_DETAIL_MEMBER_CALL(const& noexcept)
#undef IDEM_DETAIL_MEMBER_CALL

// Lambdas and function objects with exactly one, non-template operator().
template <class F>
struct CallableTraits<F, std::void_t<decltype(&F::operator())>>
    : MemberCallTraits<decltype(&F::operator())> {};

template <class P>
inline constexpr bool is_attempt_context_v =
    std::is_same_v<std::remove_cvref_t<P>, AttemptContext>&& std::is_lvalue_reference_v<P>;

// A leading std::stop_token (by value or const&) asks for cooperative cancellation only.
template <class P>
inline constexpr bool is_stop_token_v = std::is_same_v<std::remove_cvref_t<P>, std::stop_token> &&
                                        (!std::is_reference_v<P> ||
                                         std::is_const_v<std::remove_reference_t<P>>);

// Splits a parameter list into "takes a leading AttemptContext& or std::stop_token" and the rest.
template <class List>
struct StripContext;
template <>
struct StripContext<TypeList<>> {
  static constexpr bool has_context = false;
  using params = TypeList<>;
};
template <class First, class... Rest>
struct StripContext<TypeList<First, Rest...>> {
  static constexpr bool has_context = is_attempt_context_v<First> || is_stop_token_v<First>;
  using params = std::conditional_t<has_context, TypeList<Rest...>, TypeList<First, Rest...>>;
};

// How the engine hands one argument to the wrapped function again and again (once per attempt):
// always as an lvalue — a by-value parameter gets a fresh copy per attempt.
template <class P>
using ArgRef = std::conditional_t<std::is_reference_v<P>, P, P&>;

// How key and fingerprint functions see an argument.
template <class P>
using ConstArg = const std::remove_cvref_t<P>&;

template <class R, class List>
struct MakeSignature;
template <class R, class... A>
struct MakeSignature<R, TypeList<A...>> {
  using type = R(A...);
};

// The signature R(Params...) the public callable exposes for F (AttemptContext stripped).
// `void()` when F's parameters cannot be deduced; the front-ends then static_assert with advice.
template <class F, bool = CallableTraits<std::decay_t<F>>::known>
struct DeducedSignature {
  using type = void();
};
template <class F>
struct DeducedSignature<F, true> {
  using traits = CallableTraits<std::decay_t<F>>;
  using type = typename MakeSignature<typename traits::result,
                                      typename StripContext<typename traits::params>::params>::type;
};
template <class F>
using deduced_signature_t = typename DeducedSignature<F>::type;

}  // namespace idem::detail
