/* The public header must compile as strict C99 and the library must link from C. */
#include <spark/spark.h>

#include <stdio.h>
#include <string.h>

static void on_log(spark_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

int main(void) {
    spark_log_set(on_log, NULL);
    spark_model_params mp = spark_model_default_params();
    spark_context_params cp = spark_context_default_params();
    spark_model * model = NULL;
    spark_status st = spark_model_load("/nonexistent/spark-c-test", mp, &model);
    if (st != SPARK_ERR_IO || model != NULL || strlen(spark_last_error()) == 0) {
        fprintf(stderr, "unexpected: %s (%s)\n", spark_status_str(st), spark_last_error());
        return 1;
    }
    (void) cp;
    printf("spark %s from C: ok\n", spark_version());
    return 0;
}
