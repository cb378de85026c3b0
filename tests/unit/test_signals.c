/* jobs/signals.h: the handlers only record the first signal; restore puts defaults back. */
#include <signal.h>
#include <string.h>

#include "jobs/signals.h"
#include "tests/test.h"

TSR_TEST(test_signals_flag) {
    int signo = -1;
    tsr_signals_clear();
    ASSERT_OK(tsr_signals_install());
    ASSERT_OK(tsr_signals_install()); /* twice is harmless */
    ASSERT_TRUE(!tsr_signals_stop_requested(&signo));
    ASSERT_EQ_INT(signo, 0);
    raise(SIGUSR1);
    ASSERT_TRUE(tsr_signals_stop_requested(&signo));
    ASSERT_EQ_INT(signo, SIGUSR1);
    raise(SIGTERM); /* the first signal is kept: it says why the job stops */
    ASSERT_TRUE(tsr_signals_stop_requested(NULL));
    tsr_signals_stop_requested(&signo);
    ASSERT_EQ_INT(signo, SIGUSR1);
    tsr_signals_clear();
    raise(SIGINT);
    tsr_signals_stop_requested(&signo);
    ASSERT_EQ_INT(signo, SIGINT);
    tsr_signals_clear();
    tsr_signals_restore();
    struct sigaction sa;
    ASSERT_EQ_INT(sigaction(SIGTERM, NULL, &sa), 0);
    ASSERT_TRUE(sa.sa_handler == SIG_DFL);
}

TSR_TEST(test_signals_names) {
    ASSERT_STR_EQ(tsr_signals_name(SIGTERM), "SIGTERM");
    ASSERT_STR_EQ(tsr_signals_name(SIGINT), "SIGINT");
    ASSERT_STR_EQ(tsr_signals_name(SIGUSR1), "SIGUSR1");
    ASSERT_STR_CONTAINS(tsr_signals_name(SIGHUP), "signal ");
}

TSR_TEST_MAIN(test_signals_flag, test_signals_names)
